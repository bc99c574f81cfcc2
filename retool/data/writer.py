"""Parquet output written atomically: rows go to a temporary file beside the target, renamed at the end.

A stage that dies half-way (pod evicted, bad input) leaves either the previous complete file or
nothing, never a truncated parquet that a later stage would train on. An output is published only
when the share of malformed input rows stays within a limit (default 5%): a source that is mostly
junk is an error, not a small data set. Several outputs can be staged and published together, so
a preparation that fails on its third output publishes none of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from retool.data.report import MalformedLog, PrepareSummary
from retool.spec.model import MAX_MALFORMED_FRACTION_DEFAULT

FLUSH_ROWS = 8_192
DEFAULT_MAX_MALFORMED_FRACTION = MAX_MALFORMED_FRACTION_DEFAULT
"""Largest share of malformed input rows an output is published with (``spec.data.maxMalformedFraction``)."""


class TooManyMalformedError(ValueError):
    """More input rows were malformed than the limit allows; nothing was published."""


class AtomicParquetWriter:
    """Buffer rows (dicts in ``schema``), write row groups of ``flush_rows``, publish on ``commit()``."""

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, flush_rows: int = FLUSH_ROWS):
        self.path = Path(path)
        self.schema = schema
        self.flush_rows = flush_rows
        self.rows_written = 0
        self._buffer: list[dict[str, Any]] = []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # left by a killed earlier attempt
            stale.unlink(missing_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._writer = pq.ParquetWriter(self._tmp, schema)
        self._closed = False

    def write(self, row: dict[str, Any]) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=self.schema))
            self.rows_written += len(self._buffer)
            self._buffer = []

    def finish(self) -> None:
        """Write what is buffered and close the temporary file, without publishing it yet."""
        self.flush()
        self._close()

    def publish(self) -> None:
        os.replace(self._tmp, self.path)

    def commit(self) -> None:
        self.finish()
        self.publish()

    def abort(self) -> None:
        self._close()
        self._tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()

    def __enter__(self) -> AtomicParquetWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()


def malformed_problem(summary: PrepareSummary, limit: float) -> str | None:
    """Why the output must not be published for its malformed rows, or None when their share is within ``limit``."""
    if summary.rows_read == 0 or summary.malformed / summary.rows_read <= limit:
        return None
    reasons = ", ".join(f"{reason}: {count}" for reason, count in summary.malformed_by_reason.items())
    examples = "; ".join(f"{e.where}: {e.reason}: {e.snippet}" for e in summary.malformed_examples[:3])
    return (
        f"{summary.source}: {summary.malformed} of {summary.rows_read} rows are malformed ({summary.malformed / summary.rows_read:.1%}, "
        f"above the {limit:.0%} limit), so nothing was published. By reason: {reasons}. First examples: {examples}"
    )


def commit_output(
    writer: AtomicParquetWriter,
    summary: PrepareSummary,
    log: MalformedLog,
    source: str,
    *,
    max_malformed_fraction: float = DEFAULT_MAX_MALFORMED_FRACTION,
    staged: list[AtomicParquetWriter] | None = None,
) -> None:
    """Finish a conversion: flush, account for malformed rows, and publish the file only if it is fit.

    An output with no valid row, or with more than ``max_malformed_fraction`` of its input rows
    malformed, is an error naming what was read and why rows were refused (the temporary file is
    discarded), never a parquet that verl would train on. With ``staged``, the finished file is
    appended there for the caller to publish together with others.
    """
    writer.flush()
    summary.absorb(log)
    if writer.rows_written == 0:
        raise ValueError(f"{source}: no valid rows ({summary.rows_read} read, {log.count} malformed: {dict(log.by_reason)})")
    problem = malformed_problem(summary, max_malformed_fraction)
    if problem is not None:
        raise TooManyMalformedError(problem)
    if staged is None:
        writer.commit()
    else:
        writer.finish()
        staged.append(writer)
    summary.rows_written = writer.rows_written
