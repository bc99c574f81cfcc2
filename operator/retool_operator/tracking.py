"""Where a run is tracked, and its parent MLflow run.

The tracking URI is ``spec.tracking.mlflow.trackingUri``, else the chart's default
(``RETOOL_OPERATOR_MLFLOW_TRACKING_URI``), else the namespace's operator-managed tracker
(``retool-mlflow``, created on demand, owned by no run). The parent run is made by
``retool.tracking.ensure_parent_run`` (synchronous, so it runs in a worker thread). Policy when
MLflow does not answer: stage creation waits up to ``mlflowGraceSeconds`` (retrying every
``mlflowRetrySeconds``), then stages start without a parent run id (they still log to the
experiment) and the operator keeps trying; later stages get the id once it exists. Training
time is worth more than a tidy run hierarchy.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from retool.spec.model import RetoolRun
from retool_operator.builders import experiment_name, managed_mlflow_uri, run_document, run_namespace
from retool_operator.config import OperatorConfig

log = logging.getLogger(__name__)

PARENT_RUN_TIMEOUT = 20.0


@dataclass(frozen=True)
class TrackingTarget:
    uri: str
    managed: bool


def tracking_target(run: RetoolRun, config: OperatorConfig) -> TrackingTarget:
    """Pure: which MLflow server a run uses."""
    if run.spec.tracking.mlflow.tracking_uri:
        return TrackingTarget(run.spec.tracking.mlflow.tracking_uri, managed=False)
    if config.mlflow_tracking_uri:
        return TrackingTarget(config.mlflow_tracking_uri, managed=False)
    return TrackingTarget(managed_mlflow_uri(run_namespace(run)), managed=True)


@dataclass(frozen=True)
class ParentRun:
    experiment_id: str
    run_id: str
    url: str | None


def parent_run_factory() -> Callable[..., Any] | None:
    """``retool.tracking.ensure_parent_run`` when that module is installed, else None (no parent runs)."""
    try:
        module = importlib.import_module("retool.tracking")
    except ImportError:
        return None
    return getattr(module, "ensure_parent_run", None)


async def ensure_parent_run(run: RetoolRun, uri: str, factory: Callable[..., Any], *, timeout: float = PARENT_RUN_TIMEOUT) -> ParentRun:
    """Create (or find) the run's parent MLflow run; raises on any failure (the caller decides to wait or go on)."""
    meta = run.metadata.model_extra or {}
    call = asyncio.to_thread(
        factory,
        uri,
        experiment=experiment_name(run),
        namespace=run_namespace(run),
        name=run.metadata.name,
        uid=meta.get("uid") or "",
        spec_params=run_document(run)["spec"],
    )
    result = await asyncio.wait_for(call, timeout=timeout)
    return ParentRun(experiment_id=str(result.experiment_id), run_id=str(result.run_id), url=getattr(result, "url", None))
