"""The pinned upstream versions, read from versions.env (the one place they are written; the Makefile
includes the same file)."""

from __future__ import annotations

from pathlib import Path

VERSIONS_ENV = Path(__file__).with_name("versions.env")


def parse(text: str) -> dict[str, str]:
    """``NAME=value`` lines of a make/shell-compatible env file; comments and blank lines skipped.

    >>> parse("# c\\nKUEUE_VERSION=v0.19.0\\n")
    {'KUEUE_VERSION': 'v0.19.0'}
    """
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip():
            raise ValueError(f"versions.env line {number}: expected NAME=value, got {raw!r}")
        pins[name.strip()] = value.strip()
    return pins


def load(path: Path = VERSIONS_ENV) -> dict[str, str]:
    return parse(path.read_text())
