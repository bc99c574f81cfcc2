"""Log one evaluation (or data check) to an MLflow tracking server as a single run.

A thin layer over ``MlflowClient`` and the tracking helpers: the experiment is created on first
use, metric names are made legal for MLflow exactly as verl's MLflow logger does (``@`` becomes
``_at_``), params are sanitised and fitted (``retool.tracking.params.mlflow_params``), and the
run is marked FAILED when logging breaks half-way, so nothing is left RUNNING.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.recipe.metrics import to_mlflow_metrics
from retool.tracking.naming import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, run_url
from retool.tracking.params import mlflow_params

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoggedRun:
    experiment_id: str
    run_id: str
    url: str
    """The run's page in the MLflow UI (for a server URI)."""


def log_run(
    tracking_uri: str,
    experiment: str,
    *,
    run_name: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    artifacts: Iterable[Path] = (),
    tags: Mapping[str, str] | None = None,
    also: Callable[[str], object] | None = None,
    on_step: Callable[[], object] | None = None,
) -> LoggedRun:
    """Create a finished run with ``params``, ``metrics``, ``tags`` and artifacts (files, or directories
    logged under their own name); ``also(run_id)`` logs anything else before the run is finished.
    ``on_step`` is called after the metrics batch and after each artifact (progress bars)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    # The kind tag makes MLflow's UI open the experiment on its runs, not its GenAI overview (docs/recipe.md).
    experiment_id = found.experiment_id if found else client.create_experiment(experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if found is not None and EXPERIMENT_KIND_TAG not in found.tags:  # a user's choice of kind stays
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
    run_id = run.info.run_id
    try:
        timestamp = run.info.start_time
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, timestamp, 0) for k, v in sorted(to_mlflow_metrics(metrics).items())],
            params=[Param(k, v) for k, v in sorted(mlflow_params({k: str(v) for k, v in params.items()}).items())],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )
        if on_step:
            on_step()
        for path in artifacts:
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=path.name)
            else:
                client.log_artifact(run_id, str(path))
            if on_step:
                on_step()
        if also is not None:
            also(run_id)
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    # MLflow prints a "View run ... at: URL" line to stdout when a run ends; keep stdout for our output.
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        client.set_terminated(run_id, status="FINISHED")
    logger.debug("mlflow: %s", printed.getvalue().strip())
    # A database or file store has no UI of its own: name the run instead of a page.
    has_ui = tracking_uri.startswith(("http://", "https://"))
    url = run_url(tracking_uri, experiment_id, run_id) if has_ui else f"{tracking_uri} (experiment {experiment_id}, run {run_id})"
    logger.info("logged MLflow run %s", url)
    return LoggedRun(experiment_id=experiment_id, run_id=run_id, url=url)
