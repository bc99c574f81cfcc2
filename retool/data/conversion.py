"""The frame every ``prepare_*`` shares: one source read in batches into one output, published only if fit.

The SFT, RL and evaluation converters differ only in how a row becomes an output row and what they
count. Opening the output atomically, where the batches come from (the source, or ``batches`` given
by a test or a pipeline), committing or staging the finished file, and timing and logging the
summary are the same for all of them and live here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa

from retool.data.report import MalformedLog, PrepareSummary
from retool.data.sources import DEFAULT_BATCH_ROWS, RowBatch, iter_batches
from retool.data.writer import FLUSH_ROWS, AtomicParquetWriter, commit_output


class Conversion(NamedTuple):
    """What a converter works with: the summary it fills, the log of malformed rows, the output, the input."""

    summary: PrepareSummary
    log: MalformedLog
    writer: AtomicParquetWriter
    batches: Iterable[RowBatch]


@contextlib.contextmanager
def converting(
    kind: str,
    source: str,
    out: str,
    schema: pa.Schema,
    *,
    split: str,
    batches: Iterable[RowBatch] | None,
    max_malformed_fraction: float,
    staged: list[AtomicParquetWriter] | None,
    source_options: dict[str, Any],
    batch_rows: int = DEFAULT_BATCH_ROWS,
    flush_rows: int = FLUSH_ROWS,
) -> Iterator[Conversion]:
    """Open ``out``; after the block, publish it (``commit_output``: or stage it) and log the summary.

    An exception in the block, or an output ``commit_output`` refuses, leaves ``out`` untouched.
    """
    started = time.monotonic()
    summary = PrepareSummary(kind=kind, source=source, output=str(out))
    log = MalformedLog()
    with AtomicParquetWriter(out, schema, flush_rows=flush_rows) as writer:
        if batches is None:
            # S3 downloads go to the PVC (beside the output), not the pod's disk; ``source_options`` may set another batch size.
            options = {"scratch_dir": str(writer.path.parent), "batch_rows": batch_rows, **source_options}
            batches = iter_batches(source, split=split, **options)
        yield Conversion(summary, log, writer, batches)
        commit_output(writer, summary, log, source, max_malformed_fraction=max_malformed_fraction, staged=staged)
    summary.seconds = time.monotonic() - started
    summary.log()
