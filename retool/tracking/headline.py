"""The headline figures of a RetoolRun on its MLflow parent run, so MLflow's own run comparison works on parents.

A parent run holds no metrics of its own: everything is logged by its stage runs (``<run>-rl-1``,
``<run>-eval-1``...), so MLflow's "Compare" view of two RetoolRuns' parents showed nothing. After the
rl and the eval stage finish, the stage entrypoint copies the figures a reader compares first onto
the parent, read the way ``retool compare`` reads them (:func:`retool.tracking.compare.load_run_series`:
latest attempts win):

- ``final/<source>_<stat>``: the eval stage's scores (``status.results``), e.g. ``final/aime_2024_mean_at_30``;
- ``best_validation/<source>_mean_at_<n>`` and ``..._step``: the best RL validation score and the step it was reached at;
- ``progress/rl_steps_done``: the last step any rl curve was logged at.

Each name has one ``/``: MLflow 3.17 makes the part before the last ``/`` a chart section and the rest
the chart title (``extractChartSectionName`` in its UI), so ``final``, ``best_validation`` and
``progress`` are one section each.
"""

from __future__ import annotations

import logging

from retool.recipe.metrics import mlflow_metric_key
from retool.tracking._client import client, reported
from retool.tracking.compare import RunSeries, load_run_series, stat_of

log = logging.getLogger(__name__)


def headline_metrics(run: RunSeries) -> dict[str, float]:
    """The parent's headline metrics (MLflow keys) from a run's curves and eval scores (pure)."""
    metrics: dict[str, float] = {}
    for source, scores in run.eval_results.items():
        for stat, value in scores.items():
            metrics[mlflow_metric_key(f"final/{source}_{stat}")] = float(value)
    for key, series in run.metrics.items():
        found = stat_of(key)
        if found is None or not series or not found[1].startswith("mean@"):
            continue
        source, stat = found
        step = max(series, key=lambda s: (series[s], -s))
        name = mlflow_metric_key(f"best_validation/{source}_{stat}")
        metrics[name] = series[step]
        metrics[f"{name}_step"] = float(step)
    steps = [step for series in run.metrics.values() for step in series]
    if steps:
        metrics["progress/rl_steps_done"] = float(max(steps))
    return metrics


def log_headline(tracking_uri: str, parent_run_id: str) -> dict[str, float]:
    """Read the parent's stage runs and log their headline on the parent (at step 0; a later call's values are the latest)."""
    from mlflow.entities import Metric

    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"reading parent run {parent_run_id}"):
        parent = mlflow_client.get_run(parent_run_id)
    metrics = headline_metrics(load_run_series(tracking_uri, parent))
    if metrics:
        with reported(tracking_uri, f"logging the headline of parent run {parent_run_id}"):
            timestamp = int(__import__("time").time() * 1000)
            mlflow_client.log_batch(parent_run_id, metrics=[Metric(k, v, timestamp, 0) for k, v in sorted(metrics.items())])
    log.info("headline of parent run %s: %s", parent_run_id, metrics)
    return metrics
