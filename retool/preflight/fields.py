"""Every row's required fields, present and of the right type, before verl reads a data file (pure).

verl's datasets and our reward read fields by key: a row without ``reward_model`` raises
``KeyError`` deep in the rollout, a null ``content`` a template error, an integer ``ground_truth``
a reward that scores nothing. A preflight that crashes on such a row exits 1 (which the Job
treats as transient, and retries) with a traceback for a message. Here each file is read once
with pyarrow, row by row, and every required field that is missing, null or of the wrong type is a
:class:`FieldProblem` naming the file, the row and the field; the preflight reports them as the
data check's failure (``sft-data`` 12, ``rl-data`` 13, ``eval-data`` 14).

What is required (``retool.data.schema`` writes all of it; hand-made files may not):

- ``sft``: ``messages``, a non-empty list; each message a ``role`` (system, user, assistant, tool)
  and a text ``content``; each tool call a ``function`` with a text ``name`` and ``arguments`` (an
  object, or a JSON text); ``tools``, when present, a list of objects.
- ``rl`` and ``eval``: ``data_source`` text; ``prompt``, a non-empty list of messages with a text
  ``role`` and ``content``, one of them from the user; ``reward_model`` an object with a text
  ``ground_truth``; ``extra_info`` and ``agent_name``, when present, an object and a text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

KINDS = ("sft", "rl", "eval")
ROLES = ("system", "user", "assistant", "tool")
MISSING = object()
BATCH_ROWS = 1024


@dataclass(frozen=True)
class FieldProblem:
    file: str
    row: int
    field: str
    problem: str
    """``missing``, ``null``, or what the value is instead of what it should be."""

    def __str__(self) -> str:
        return f"{self.file} row {self.row}: field {self.field} is {self.problem}"


def describe(value: Any) -> str:
    """A value's type and a short repr, for a wrong-type problem."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _check(value: Any, field: str, expected: str) -> str | None:
    """Why ``value`` is not a valid ``expected`` (``text``, ``object``, ``list``), or None."""
    if value is MISSING:
        return "missing"
    if value is None:
        return "null"
    ok = {"text": isinstance(value, str), "object": isinstance(value, Mapping), "list": isinstance(value, list | tuple)}[expected]
    if ok:
        return None
    article = "an" if expected == "object" else "a"
    return f"{describe(value)}, not {article} {expected}"


def _get(container: Any, key: str) -> Any:
    return container.get(key, MISSING) if isinstance(container, Mapping) else MISSING


def _messages(row: Mapping[str, Any], key: str, *, sft: bool) -> Iterator[tuple[str, str]]:
    messages = _get(row, key)
    if (problem := _check(messages, key, "list")) is not None:
        yield key, problem
        return
    if not messages:
        yield key, "an empty list"
        return
    roles = []
    for position, message in enumerate(messages):
        where = f"{key}[{position}]"
        if (problem := _check(message, where, "object")) is not None:
            yield where, problem
            continue
        role = _get(message, "role")
        if (problem := _check(role, f"{where}.role", "text")) is not None:
            yield f"{where}.role", problem
        elif role not in ROLES:
            yield f"{where}.role", f"{role!r}, not one of {', '.join(ROLES)}"
        roles.append(role)
        if (problem := _check(_get(message, "content"), f"{where}.content", "text")) is not None:
            yield f"{where}.content", problem
        calls = _get(message, "tool_calls")
        if not sft or calls is MISSING or calls is None:
            continue
        if (problem := _check(calls, f"{where}.tool_calls", "list")) is not None:
            yield f"{where}.tool_calls", problem
            continue
        for index, call in enumerate(calls):
            at = f"{where}.tool_calls[{index}].function"
            function = _get(call, "function")
            if (problem := _check(function, at, "object")) is not None:
                yield at, problem
                continue
            if (problem := _check(_get(function, "name"), f"{at}.name", "text")) is not None:
                yield f"{at}.name", problem
            arguments = _get(function, "arguments")
            if arguments is MISSING or arguments is None or not isinstance(arguments, Mapping | str):
                yield f"{at}.arguments", _check(arguments, f"{at}.arguments", "object") or "not an object"
    if not sft and "user" not in roles:
        yield key, "a chat without a user message"


def row_problems(row: Mapping[str, Any], kind: str) -> Iterator[tuple[str, str]]:
    """(field, problem) for every required field of one row of a ``kind`` file."""
    if kind == "sft":
        yield from _messages(row, "messages", sft=True)
        tools = _get(row, "tools")
        if tools is not MISSING and tools is not None:
            if (problem := _check(tools, "tools", "list")) is not None:
                yield "tools", problem
            else:
                for index, tool in enumerate(tools):
                    if (problem := _check(tool, f"tools[{index}]", "object")) is not None:
                        yield f"tools[{index}]", problem
        return
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r}; kinds are {', '.join(KINDS)}")
    if (problem := _check(_get(row, "data_source"), "data_source", "text")) is not None:
        yield "data_source", problem
    yield from _messages(row, "prompt", sft=False)
    reward = _get(row, "reward_model")
    if (problem := _check(reward, "reward_model", "object")) is not None:
        yield "reward_model", problem
    elif (problem := _check(_get(reward, "ground_truth"), "reward_model.ground_truth", "text")) is not None:
        yield "reward_model.ground_truth", problem
    for field, expected in (("extra_info", "object"), ("agent_name", "text")):
        value = _get(row, field)
        if value is not MISSING and value is not None and (problem := _check(value, field, expected)) is not None:
            yield field, problem


def file_problems(path: str, kind: str, *, limit: int = 20) -> tuple[list[FieldProblem], int]:
    """(the first ``limit`` problems of the file, how many there are in all); OSError / ArrowException
    when the file cannot be read as Parquet (the loader reports that)."""
    problems: list[FieldProblem] = []
    total = 0
    start = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        for offset, row in enumerate(batch.to_pylist()):
            for field, problem in row_problems(row, kind):
                total += 1
                if len(problems) < limit:
                    problems.append(FieldProblem(path, start + offset, field, problem))
        start += batch.num_rows
    return problems, total


def files_problems(files: Any, kind: str, *, limit: int = 20) -> tuple[list[FieldProblem], int]:
    """:func:`file_problems` over one path or a list of paths (unreadable files left to the loader)."""
    import pyarrow as pa

    paths = [files] if isinstance(files, str) else [str(f) for f in files]
    found: list[FieldProblem] = []
    total = 0
    for path in paths:
        try:
            problems, count = file_problems(path, kind, limit=max(limit - len(found), 0))
        except (OSError, pa.ArrowException):
            continue
        found += problems
        total += count
    return found, total


def summary(problems: list[FieldProblem], total: int, kind: str) -> str:
    """The data check's failure message: how many, and the first problems."""
    shown = "; ".join(str(p) for p in problems[:3])
    more = f" (and {total - 3} more)" if total > 3 else ""
    return f"{total} missing, null or mistyped field(s) in the {kind} data, which verl or the reward would crash on: {shown}{more}"
