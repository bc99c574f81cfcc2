"""The keys of the chart's values.yaml and their helm-docs ``# --`` comments, read line by line.

A key whose comment block starts with ``# --`` holds a documented value (its nested lines are that
value's default and are not keys of their own); a key without one is a section whose own keys must
be documented. The metadata test checks that every value is documented, the README test that the
README lists every documented value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ValueKey:
    line: int
    """0-based index of the key's line."""
    path: str
    """Dotted path (``sandbox.resources``)."""
    documented: bool
    has_children: bool


def value_keys(text: str) -> Iterator[ValueKey]:
    """Every key of ``text`` outside a documented value's default, in order."""
    lines = text.splitlines()
    stack: list[tuple[int, str]] = []  # enclosing sections: (indent, key)
    value_indent: int | None = None  # inside a documented value's nested default
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):(\s|$)", line)
        if not m:
            continue
        indent = len(m.group(1))
        if value_indent is not None and indent > value_indent:
            continue
        value_indent = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --") and all(lines[k].strip().startswith("#") for k in range(j, i))
        yield ValueKey(i, ".".join([k for _, k in stack] + [m.group(2)]), documented, _has_children(lines, i, indent))
        if documented:
            value_indent = indent
        else:
            stack.append((indent, m.group(2)))


def _has_children(lines: list[str], i: int, indent: int) -> bool:
    for nxt in lines[i + 1 :]:
        if not nxt.strip() or nxt.strip().startswith("#"):
            continue
        return len(nxt) - len(nxt.lstrip()) > indent
    return False
