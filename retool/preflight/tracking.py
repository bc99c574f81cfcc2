"""The preflight's report in MLflow: artifacts, figures as metrics, the verdict as tags.

In a stage pod the stage entry has opened the attempt's run and handed its id over as
``MLFLOW_RUN_ID``; ``retool preflight`` on a workstation opens a run of its own in the given
experiment. Tracking never decides the verdict: an MLflow failure is logged and the preflight's
exit status stays what the checks found.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from retool.preflight.report import Report
from retool.tracking import TrackingError, ensure_experiment
from retool.tracking._client import client, reported

logger = logging.getLogger(__name__)

ARTIFACT_DIR = "preflight"
TAG_VERDICT = "retool.preflight"
TAG_FAILURE = "retool.preflight.failure"
TAG_WARNINGS = "retool.preflight.warnings"
MAX_TAG = 5000


def metrics_of(report: Report) -> dict[str, float]:
    """Numeric figures of the report, under ``preflight/`` (MLflow keys: no ``@``)."""
    values = {f"preflight/{key}": float(value) for key, value in report.facts.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    values["preflight/seconds"] = round(report.seconds, 2)
    values["preflight/failed_checks"] = float(sum(r.failed for r in report.results))
    values["preflight/exit_code"] = float(report.exit_code)
    return values


def log_report(tracking_uri: str, run_id: str, report: Report, files: tuple[Path, ...]) -> None:
    from mlflow.entities import Metric

    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"logging the preflight report on run {run_id}"):
        for path in files:
            mlflow_client.log_artifact(run_id, str(path), ARTIFACT_DIR)
        now = int(time.time() * 1000)
        mlflow_client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in sorted(metrics_of(report).items())])
        mlflow_client.set_tag(run_id, TAG_VERDICT, "passed" if report.passed else "failed")
        if report.failure:
            mlflow_client.set_tag(run_id, TAG_FAILURE, report.failure[:MAX_TAG])
        elif report.warnings:
            mlflow_client.set_tag(run_id, TAG_WARNINGS, report.warnings[:MAX_TAG])


def open_run(tracking_uri: str, experiment: str, run_name: str) -> str:
    """A run of its own for a preflight started outside a stage pod."""
    experiment_id = ensure_experiment(tracking_uri, experiment)
    with reported(tracking_uri, f"creating run {run_name}"):
        return client(tracking_uri).create_run(experiment_id, run_name=run_name, tags={TAG_VERDICT: "running"}).info.run_id


def log_safely(tracking_uri: str, run_id: str, report: Report, files: tuple[Path, ...]) -> bool:
    try:
        log_report(tracking_uri, run_id, report, files)
    except TrackingError as err:
        logger.warning("the preflight report could not be logged to MLflow: %s", err)
        return False
    logger.info("preflight report logged to MLflow run %s", run_id)
    return True
