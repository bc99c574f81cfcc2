"""Evaluation results and validation generations in MLflow.

``log_eval_results`` turns the eval stage's per-sample results into verl-named metrics (see
``retool.recipe.metrics``), logs them with MLflow-safe keys, and stores the evidence as
artifacts: the samples (JSONL and an MLflow table the UI renders), the metrics under their
verl names, and the per-source summary the operator copies into status.results.

``log_validation_samples`` logs a sample of one validation round's generations as an MLflow
table (``validation/step_000040.json``), and ``sync_validation_dumps`` does so for every round
verl has dumped to ``trainer.validation_data_dir`` (``<step>.jsonl``) and MLflow lacks yet, so
a stage script can call it periodically while training runs.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retool.recipe.metrics import VERL_SEED, results_by_source, samples_from_rows, to_mlflow_metrics, validation_metrics
from retool.tracking._client import client, reported

log = logging.getLogger(__name__)

METRICS_PER_BATCH = 1000
VALIDATION_DIR = "validation"
RESULTS_ARTIFACT = "eval/results.json"
"""The per-source summary of an eval attempt: what the operator copies into status.results, and ``retool compare``'s final scores."""
_DUMP_FILE = re.compile(r"^(\d+)\.jsonl$")
_TABLE_FILE = re.compile(r"^step_(\d+)\.json$")


@dataclass(frozen=True)
class EvalResults:
    metrics: dict[str, float]
    """verl names: val-core/aime_2024/acc/mean@30, ..."""
    results: dict[str, dict[str, float]]
    """Per data source, short names: {aime_2024: {mean@30: .., maj@30: .., best@30: .., pass@30: ..}}."""


def read_sample_rows(path: str) -> list[dict[str, Any]]:
    """Per-sample results from ``.jsonl`` (verl's validation dump or ours) or ``.csv``."""
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    if not path.endswith(".jsonl"):
        raise ValueError(f"{path}: per-sample results must be .jsonl or .csv")
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
    return rows


def _columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    names: list[str] = []
    for row in rows:
        names.extend(key for key in row if key not in names)
    return {name: [_cell(row.get(name)) for row in rows] for name in names}


def _cell(value: Any) -> Any:
    # Tables hold scalars; nested values (a ground truth list, extra info) are shown as JSON.
    return value if value is None or isinstance(value, str | int | float | bool) else json.dumps(value, ensure_ascii=False)


def log_eval_results(tracking_uri: str, run_id: str, rows: Iterable[Mapping[str, Any]], *, step: int = 0, seed: int = VERL_SEED) -> EvalResults:
    """Compute and log the eval metrics of ``rows`` (per-sample results) on ``run_id``; returns them."""
    rows = list(rows)
    if not rows:
        raise ValueError("no per-sample results to evaluate")
    metrics = validation_metrics(*samples_from_rows(rows), seed=seed)
    results = EvalResults(metrics=metrics, results=results_by_source(metrics))
    mlflow_client = client(tracking_uri)
    from mlflow.entities import Metric

    with reported(tracking_uri, f"logging eval results on run {run_id}"), tempfile.TemporaryDirectory() as tmp:
        timestamp = _now_ms()
        items = sorted(to_mlflow_metrics(metrics).items())
        for start in range(0, len(items), METRICS_PER_BATCH):
            batch = [Metric(key, value, timestamp, step) for key, value in items[start : start + METRICS_PER_BATCH]]
            mlflow_client.log_batch(run_id, metrics=batch)
        samples = os.path.join(tmp, "samples.jsonl")
        with open(samples, "w") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        mlflow_client.log_artifact(run_id, samples, "eval")
        mlflow_client.log_table(run_id, _columns(rows), "eval/samples_table.json")
        mlflow_client.log_dict(run_id, metrics, "eval/metrics.json")
        mlflow_client.log_dict(run_id, results.results, RESULTS_ARTIFACT)
    return results


def load_eval_results(tracking_uri: str, run_id: str) -> dict[str, dict[str, float]]:
    """The per-source summary an eval run logged (``eval/results.json``): what the operator puts in status.results."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"reading the eval results of run {run_id}"), tempfile.TemporaryDirectory() as tmp:
        path = mlflow_client.download_artifacts(run_id, RESULTS_ARTIFACT, tmp)
        with open(path) as f:
            return json.load(f)


def _now_ms() -> int:
    return int(time.time() * 1000)


def log_validation_samples(run_id: str, samples: Sequence[Any], step: int, *, tracking_uri: str | None = None) -> str:
    """Log one validation round's generations as an MLflow table; returns the artifact path.

    ``samples`` are verl's ``(input, output, score)`` tuples or mappings with those keys (more
    keys become more columns). ``tracking_uri`` defaults to ``MLFLOW_TRACKING_URI``.
    """
    if step < 0:
        raise ValueError("step must be >= 0")
    rows = [dict(zip(("input", "output", "score"), s, strict=True)) if isinstance(s, list | tuple) else dict(s) for s in samples]
    table = {"step": [step] * len(rows), **_columns(rows)}
    artifact = f"{VALIDATION_DIR}/step_{step:06d}.json"
    with reported(tracking_uri, f"logging validation generations of step {step} on run {run_id}"):
        client(tracking_uri).log_table(run_id, table, artifact)
    return artifact


def sample_like_verl(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """verl's choice of generations to log: sort by input, shuffle with seed 42, keep the first ``limit``."""
    ordered = sorted(rows, key=lambda row: str(row.get("input", "")))
    np.random.RandomState(42).shuffle(ordered)
    return ordered[:limit]


def sync_validation_dumps(tracking_uri: str, run_id: str, dump_dir: str, *, limit: int = 20) -> list[int]:
    """Log every ``<step>.jsonl`` in ``dump_dir`` that has no ``validation/step_<step>.json`` yet; returns the steps logged."""
    if not os.path.isdir(dump_dir):
        return []
    dumped = sorted(int(m.group(1)) for name in os.listdir(dump_dir) if (m := _DUMP_FILE.match(name)))
    if not dumped:
        return []
    with reported(tracking_uri, f"listing validation tables of run {run_id}"):
        present = {
            int(m.group(1)) for info in client(tracking_uri).list_artifacts(run_id, VALIDATION_DIR) if (m := _TABLE_FILE.match(os.path.basename(info.path)))
        }
    logged = []
    for step in dumped:
        if step in present:
            continue
        rows = read_sample_rows(os.path.join(dump_dir, f"{step}.jsonl"))
        keep = ("input", "output", "gts", "score", "acc", "pred")
        chosen = [{key: row[key] for key in keep if key in row} for row in sample_like_verl(rows, limit)]
        log_validation_samples(run_id, chosen, step, tracking_uri=tracking_uri)
        logged.append(step)
    if logged:
        log.info("logged validation generations of steps %s to run %s", logged, run_id)
    return logged
