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
from retool_operator.builders import experiment_name, managed_mlflow_uri, run_namespace
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


def _tracking_module() -> Any | None:
    try:
        return importlib.import_module("retool.tracking")
    except ImportError:
        return None


def parent_run_factory() -> Callable[..., Any] | None:
    """``retool.tracking.ensure_parent_run`` when that module is installed, else None (no parent runs)."""
    module = _tracking_module()
    return getattr(module, "ensure_parent_run", None) if module is not None else None


def _spec_params(run: RetoolRun) -> dict[str, str]:
    module = _tracking_module()
    if module is not None and hasattr(module, "spec_params"):
        return dict(module.spec_params(run))
    return {}


def same_tracker(known_url: str | None, uri: str | None) -> bool:
    """Whether a parent run recorded in status (its UI URL, under its tracking URI) lives on the tracker
    at ``uri``: after ``spec.tracking.mlflow.trackingUri`` (or the chart's tracker) changed mid-run, the
    old run id means nothing to the new tracker, so a parent run is made there instead of reusing it."""
    if not uri or not known_url:
        return True
    return known_url.rstrip("/") == uri.rstrip("/") or known_url.startswith(uri.rstrip("/") + "/")


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
        spec_params=_spec_params(run),
    )
    result = await asyncio.wait_for(call, timeout=timeout)
    return ParentRun(experiment_id=str(result.experiment_id), run_id=str(result.run_id), url=getattr(result, "url", None))


async def eval_results(uri: str, parent_run_id: str, attempt: int, *, timeout: float = PARENT_RUN_TIMEOUT) -> dict[str, dict[str, float]]:
    """The eval stage's per-source results (``eval/results.json`` of its MLflow run), {} when unavailable.

    The eval stage attempt's run is found again by (parent, stage, attempt): it exists once the
    stage has run, so this only reads.
    """
    module = _tracking_module()
    if module is None or not hasattr(module, "load_eval_results") or not hasattr(module, "start_stage_run"):
        return {}

    def read() -> dict[str, dict[str, float]]:
        run_id = module.start_stage_run(uri, parent_run_id, "eval", attempt)
        return module.load_eval_results(uri, run_id)

    try:
        results = await asyncio.wait_for(asyncio.to_thread(read), timeout=timeout)
    except Exception as err:  # results are a nicety: never fail a pass over them
        log.warning("eval results of parent run %s not readable yet: %s", parent_run_id, err)
        return {}
    return {str(source): {str(m): float(x) for m, x in (metrics or {}).items() if isinstance(x, int | float)} for source, metrics in (results or {}).items()}


_UNREAD = object()
"""What :func:`_call` returns when ``retool.tracking`` is missing or the call failed."""


async def _call(name: str, *args: Any, timeout: float, what: str) -> Any:
    """``retool.tracking.<name>(*args)`` in a worker thread, bounded by ``timeout``; ``_UNREAD`` when the
    module lacks it or the call fails (logged as ``what``): MLflow is a view on training, never a reason
    to fail a pass."""
    module = _tracking_module()
    function = getattr(module, name, None) if module is not None else None
    if function is None:
        return _UNREAD
    try:
        return await asyncio.wait_for(asyncio.to_thread(function, *args), timeout=timeout)
    except Exception as err:
        log.warning("%s: %s", what, err)
        return _UNREAD


async def reward_suspect(uri: str, parent_run_id: str, attempt: int, *, timeout: float = PARENT_RUN_TIMEOUT) -> str | None:
    """The rl attempt's reward-watch state (``retool.tracking.reward_suspect``); None when unknown or unreadable."""
    value = await _call("reward_suspect", uri, parent_run_id, attempt, timeout=timeout, what=f"reward watch of parent run {parent_run_id} not readable")
    return None if value is _UNREAD or value is None else str(value)


async def log_cost(uri: str, parent_run_id: str, figures: dict[str, float], *, timeout: float = PARENT_RUN_TIMEOUT) -> bool:
    """The run's cost figures on its parent run (``retool.tracking.log_run_cost``); False when MLflow did not take them."""
    done = await _call("log_run_cost", uri, parent_run_id, figures, timeout=timeout, what=f"cost of parent run {parent_run_id} not logged")
    return done is not _UNREAD


async def request_save(uri: str, parent_run_id: str, attempt: int, reason: str, *, timeout: float = PARENT_RUN_TIMEOUT) -> bool:
    """``retool.tracking.request_save``: True once the request is on the attempt's run (False: no run yet, or MLflow did not
    answer; asked again next pass, and the scheduled saves still count)."""
    what = f"save request to rl attempt {attempt} of parent run {parent_run_id} not delivered"
    run_id = await _call("request_save", uri, parent_run_id, attempt, reason, timeout=timeout, what=what)
    return run_id is not _UNREAD and run_id is not None


async def stage_attempt_tags(uri: str, parent_run_id: str, stage: str, attempt: int, *, timeout: float = PARENT_RUN_TIMEOUT) -> dict[str, str]:
    """The tags of a stage attempt's MLflow run; {} when it has none yet or MLflow does not answer."""
    what = f"tags of {stage} attempt {attempt} of parent run {parent_run_id} not readable"
    tags = await _call("stage_attempt_tags", uri, parent_run_id, stage, attempt, timeout=timeout, what=what)
    return {} if tags is _UNREAD else dict(tags or {})
