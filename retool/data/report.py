"""What a preparation did: rows in, rows out, duplicates, and every malformed row accounted for.

Malformed rows are never dropped silently: each is counted by reason, the first few are kept as
examples (where they were and why), and the summary is logged and returned to the caller.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

MAX_EXAMPLES = 5
SNIPPET_CHARS = 240
FIELD_CHARS = 100


class MalformedRowError(ValueError):
    """A row that cannot be converted; the message says what is wrong with it."""


@dataclass(frozen=True)
class MalformedExample:
    where: str
    reason: str
    snippet: str


@dataclass
class MalformedLog:
    """Counts malformed rows by reason and keeps the first ``MAX_EXAMPLES`` of them."""

    count: int = 0
    by_reason: Counter = field(default_factory=Counter)
    examples: list[MalformedExample] = field(default_factory=list)

    def add(self, where: str, reason: str, row: Any = None, times: int = 1) -> None:
        self.count += times
        self.by_reason[reason] += times
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(MalformedExample(where=where, reason=reason, snippet=snippet(row)))


def _shorten(value: Any) -> Any:
    """Long strings keep their head and tail: enough to recognise a row, short enough for a log line."""
    if isinstance(value, str) and len(value) > FIELD_CHARS:
        half = FIELD_CHARS // 2
        return value[:half] + " ... " + value[-half:]
    if isinstance(value, dict):
        return {key: _shorten(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_shorten(item) for item in value]
    return value


def snippet(row: Any) -> str:
    """A short, single-line rendering of a row for reports."""
    if row is None:
        return ""
    try:
        text = json.dumps(_shorten(row), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(row)
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 3] + "..."


@dataclass
class PrepareSummary:
    """Returned by every ``prepare_*`` function and printed by ``retool data prepare``."""

    kind: str
    source: str
    output: str
    rows_read: int = 0
    rows_written: int = 0
    duplicates: int = 0
    malformed: int = 0
    malformed_by_reason: dict[str, int] = field(default_factory=dict)
    malformed_examples: list[MalformedExample] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def absorb(self, log: MalformedLog) -> None:
        self.malformed = log.count
        self.malformed_by_reason = dict(log.by_reason.most_common())
        self.malformed_examples = list(log.examples)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"{self.kind}: {self.source} -> {self.output}",
            f"  rows read {self.rows_read}, written {self.rows_written}, duplicates {self.duplicates}, malformed {self.malformed} ({self.seconds:.1f} s)",
        ]
        lines += [f"  {name}: {value}" for name, value in sorted(self.counters.items())]
        lines += [f"  malformed, {reason}: {count}" for reason, count in self.malformed_by_reason.items()]
        lines += [f"  example at {e.where}: {e.reason}: {e.snippet}" for e in self.malformed_examples]
        return "\n".join(lines)

    def log(self) -> None:
        level = logging.WARNING if self.malformed else logging.INFO
        logger.log(level, "%s", self.render())


def reached(max_rows: int | None, written: int) -> bool:
    """Whether a preparation limited to ``max_rows`` (``spec.data.maxRows``) has written enough."""
    return max_rows is not None and written >= max_rows


def limit_counter(max_rows: int | None, written: int) -> dict[str, int]:
    """``{"stopped_at_max_rows": N}`` when the limit cut the source short (shown in the summary)."""
    return {"stopped_at_max_rows": max_rows} if reached(max_rows, written) else {}
