"""Prepare every data set of a RetoolRun where the later stages expect it (``retool.runtime.paths``).

This is what the operator's ``prepare`` stage runs. Every output is staged first and all of them are
published together only when each one is fit (readable, with valid rows, malformed rows within
``spec.data.maxMalformedFraction``): a run never starts on a mix of fresh and stale files. A retried
stage simply redoes the work; a summary of all outputs is written beside them as JSON.
"""

from __future__ import annotations

import json
import logging
import posixpath
from pathlib import Path
from typing import Any

from retool.data.eval import prepare_eval
from retool.data.report import PrepareSummary
from retool.data.rl import prepare_rl
from retool.data.schema import agent_name_for
from retool.data.sft import prepare_sft
from retool.data.writer import AtomicParquetWriter
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun

logger = logging.getLogger(__name__)

SUMMARY_FILE = "prepare-summary.json"


def s3_endpoint_for(run: RetoolRun) -> str | None:
    """The run's S3-compatible endpoint (storage.s3.endpoint), used for s3:// data sources too."""
    return run.spec.storage.s3.endpoint if run.spec.storage.s3 is not None else None


def summary_path(run: RetoolRun) -> str:
    return posixpath.join(run_paths(run).data, SUMMARY_FILE)


def prepare_run(run: RetoolRun, *, s3_endpoint: str | None = None, split: str = "train", max_malformed_fraction: float | None = None) -> list[PrepareSummary]:
    """Write the SFT (when SFT is enabled), RL and every eval set of ``run``; return their summaries.

    ``max_malformed_fraction`` overrides the run's ``spec.data.maxMalformedFraction``. Nothing is
    published unless every output is fit.
    """
    paths = run_paths(run)
    data = run.spec.data
    limit = data.max_malformed_fraction if max_malformed_fraction is None else max_malformed_fraction
    staged: list[AtomicParquetWriter] = []
    options: dict[str, Any] = {
        "split": split,
        "s3_endpoint": s3_endpoint or s3_endpoint_for(run),
        "max_malformed_fraction": limit,
        "staged": staged,
        "max_rows": data.max_rows,
    }
    agent = agent_name_for(run.spec.recipe)
    summaries: list[PrepareSummary] = []
    try:
        if run.spec.sft.enabled:
            summaries.append(prepare_sft(data.sft, paths.sft_train, **options))
        else:
            logger.info("sft disabled: not preparing %s", data.sft)
        summaries.append(prepare_rl(data.rl, paths.rl_train, agent_name=agent, **options))
        for eval_set in data.eval:
            summaries.append(prepare_eval(eval_set.source, paths.eval_set(eval_set.name), name=eval_set.name, agent_name=agent, **options))
    except BaseException:
        for writer in staged:
            writer.abort()
        raise
    for writer in staged:
        writer.publish()
    target = Path(summary_path(run))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps([s.to_dict() for s in summaries], indent=2, default=str) + "\n")
    return summaries
