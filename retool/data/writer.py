"""Parquet output written atomically: rows go to a temporary file beside the target, renamed at the end.

A stage that dies half-way (pod evicted, bad input) leaves either the previous complete file or
nothing, never a truncated parquet that a later stage would train on.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from retool.data.report import MalformedLog, PrepareSummary

FLUSH_ROWS = 8_192


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

    def write(self, row: dict[str, Any]) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=self.schema))
            self.rows_written += len(self._buffer)
            self._buffer = []

    def commit(self) -> None:
        self.flush()
        self._writer.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicParquetWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()


def commit_output(writer: AtomicParquetWriter, summary: PrepareSummary, log: MalformedLog, source: str) -> None:
    """Finish a conversion: flush, account for malformed rows, and publish the file only if it has rows.

    An output with no valid row is an error naming what was read and why rows were refused (the
    temporary file is discarded), never an empty parquet that verl would fail on hours later.
    """
    writer.flush()
    summary.absorb(log)
    if writer.rows_written == 0:
        raise ValueError(f"{source}: no valid rows ({summary.rows_read} read, {log.count} malformed: {dict(log.by_reason)})")
    writer.commit()
    summary.rows_written = writer.rows_written
