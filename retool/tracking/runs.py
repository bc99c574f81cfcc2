"""Experiments, the parent run of a RetoolRun and the run of each stage attempt.

All functions are synchronous, idempotent and thread-safe (see ``_client``); the operator
calls them as ``await asyncio.to_thread(ensure_parent_run, ...)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from retool.runtime.context import StageContext
from retool.tracking import naming
from retool.tracking._client import TrackingError, client, is_resource_exists, reported
from retool.tracking.naming import SAVE_REQUEST_TAG
from retool.tracking.params import batches, param_changes

log = logging.getLogger(__name__)

RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")


@dataclass(frozen=True)
class ParentRun:
    experiment_id: str
    run_id: str
    url: str
    changed_params: tuple[str, ...] = ()
    """Spec fields whose value differs from the one logged when the run was created (MLflow params are immutable)."""


def ensure_experiment(tracking_uri: str, name: str) -> str:
    """The experiment's id, creating it (or restoring it if someone deleted it in the UI)."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"finding experiment {name!r}"):
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return mlflow_client.create_experiment(name, tags={"retool.managed": "true", naming.EXPERIMENT_KIND_TAG: naming.EXPERIMENT_KIND})
            except Exception as exc:
                if not is_resource_exists(exc):
                    raise
                experiment = mlflow_client.get_experiment_by_name(name)  # created concurrently
        if experiment.lifecycle_stage == "deleted":
            log.warning("restoring deleted MLflow experiment %r", name)
            mlflow_client.restore_experiment(experiment.experiment_id)
        if naming.EXPERIMENT_KIND_TAG not in experiment.tags:  # made by verl's logger, or before the tag existed; a user's choice stays
            mlflow_client.set_experiment_tag(experiment.experiment_id, naming.EXPERIMENT_KIND_TAG, naming.EXPERIMENT_KIND)
        return experiment.experiment_id


def _find_one(mlflow_client: Any, experiment_ids: list[str], filter_string: str) -> Any | None:
    runs = mlflow_client.search_runs(experiment_ids, filter_string=filter_string, max_results=1, order_by=["attributes.start_time ASC"])
    return runs[0] if runs else None


def ensure_parent_run(
    tracking_uri: str, *, experiment: str, namespace: str | None, name: str, uid: str, spec_params: Mapping[str, str], image: str | None = None
) -> ParentRun:
    """Find the RetoolRun's parent run by ``retool.uid`` or create it; log the spec params not yet logged.

    A retry or an operator restart finds the same run, so there is never a second parent. A spec
    edited since creation cannot overwrite params (MLflow forbids it): the changed keys are
    returned and listed in the ``retool.paramsChanged`` tag; each stage run records the spec it ran.
    """
    if not uid:
        raise ValueError("uid is required: it is how the parent run is found again")
    experiment_id = ensure_experiment(tracking_uri, experiment)
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"ensuring the parent run of {namespace}/{name}"):
        found = _find_one(mlflow_client, [experiment_id], naming.parent_run_filter(uid))
        if found is None:
            tags = {**naming.parent_tags(namespace=namespace, name=name, uid=uid, image=image), naming.NOTE_TAG: naming.parent_description(namespace, name)}
            run = mlflow_client.create_run(experiment_id, run_name=name, tags=tags)
            run_id, existing = run.info.run_id, {}
            log.info("created MLflow parent run %s for %s/%s in experiment %s", run_id, namespace, name, experiment_id)
        else:
            run_id, existing = found.info.run_id, dict(found.data.params)
        new, changed = param_changes(existing, spec_params)
        from mlflow.entities import Param

        for batch in batches(new):
            mlflow_client.log_batch(run_id, params=[Param(k, v) for k, v in batch.items()])
        if changed:
            log.warning("spec of %s/%s changed since its MLflow run was created: %s", namespace, name, ", ".join(changed))
            mlflow_client.set_tag(run_id, naming.TAG_PARAMS_CHANGED, ",".join(changed)[: naming.MAX_TAG_VALUE])
    return ParentRun(experiment_id=experiment_id, run_id=run_id, url=naming.run_url(tracking_uri, experiment_id, run_id), changed_params=tuple(changed))


def start_stage_run(tracking_uri: str, parent_run_id: str, stage: str, attempt: int, tags: Mapping[str, str] | None = None) -> str:
    """The run of one stage attempt, nested under the parent; found again by (parent, stage, attempt).

    Its name is ``<run>-<stage>-<attempt>`` like the stage's Job/RayJob. Hand its id to the stage
    as ``MLFLOW_RUN_ID``: verl's MLflow logger then resumes this run instead of creating one.
    """
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"starting the MLflow run of stage {stage} attempt {attempt}"):
        parent = mlflow_client.get_run(parent_run_id)
        parent_tags = dict(parent.data.tags)
        if parent_tags.get(naming.TAG_ROLE) != naming.ROLE_PARENT:
            raise TrackingError(f"MLflow run {parent_run_id} is not a RetoolRun parent run (tag {naming.TAG_ROLE} is {parent_tags.get(naming.TAG_ROLE)!r})")
        experiment_id = parent.info.experiment_id
        found = _find_one(mlflow_client, [experiment_id], naming.stage_run_filter(parent_run_id, stage, attempt))
        if found is not None:
            return found.info.run_id
        run_tags = naming.stage_tags(parent_tags, parent_run_id, stage, attempt, dict(tags or {}))
        run_name = naming.stage_run_name(parent_tags.get(naming.TAG_NAME, "run"), stage, attempt)
        run = mlflow_client.create_run(experiment_id, run_name=run_name, tags=run_tags)
        log.info("created MLflow run %s (%s) under parent %s", run.info.run_id, run_name, parent_run_id)
        return run.info.run_id


REWARD_SUSPECT_TAG = "retool.rewardSuspect"
"""Set by the rl stage's reward watch (``retool.recipe.verl_plugins.watch``): a message while the second
verifier keeps disagreeing with the reward, empty once it agrees again."""


def reward_suspect(tracking_uri: str, parent_run_id: str, attempt: int) -> str | None:
    """The rl stage attempt's ``retool.rewardSuspect`` tag: a message, "" (cleared), or None (no run or no tag yet). Only reads."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"reading the reward watch of run {parent_run_id}"):
        parent = mlflow_client.get_run(parent_run_id)
        found = _find_one(mlflow_client, [parent.info.experiment_id], naming.stage_run_filter(parent_run_id, "rl", attempt))
    return None if found is None else found.data.tags.get(REWARD_SUSPECT_TAG)


def stage_attempt_tags(tracking_uri: str, parent_run_id: str, stage: str, attempt: int) -> dict[str, str] | None:
    """The tags of a stage attempt's run (None while it has none). Only reads."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"reading the tags of stage {stage} attempt {attempt} of run {parent_run_id}"):
        parent = mlflow_client.get_run(parent_run_id)
        found = _find_one(mlflow_client, [parent.info.experiment_id], naming.stage_run_filter(parent_run_id, stage, attempt))
    return None if found is None else dict(found.data.tags)


def request_save(tracking_uri: str, parent_run_id: str, attempt: int, reason: str) -> str | None:
    """Ask the rl stage's attempt to save at its next step boundary: ``retool.saveRequest`` on that attempt's run.
    Returns the run id, or None while the attempt has made no run yet (its trainer could not read one; ask again)."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"asking rl attempt {attempt} of run {parent_run_id} to save"):
        parent = mlflow_client.get_run(parent_run_id)
        found = _find_one(mlflow_client, [parent.info.experiment_id], naming.stage_run_filter(parent_run_id, "rl", attempt))
        if found is None:
            return None
        mlflow_client.set_tag(found.info.run_id, SAVE_REQUEST_TAG, reason[:4900])
    return found.info.run_id


def log_run_cost(tracking_uri: str, parent_run_id: str, figures: Mapping[str, float]) -> None:
    """The operator's ``status.cost`` figures as metrics of the parent run (``cost/device_hours``, ...), each
    time a stage attempt ends: their history is the cost over the run's life, their last value its total."""
    from mlflow.entities import Metric

    now_ms = int(time.time() * 1000)
    with reported(tracking_uri, f"logging the cost of run {parent_run_id}"):
        client(tracking_uri).log_batch(parent_run_id, metrics=[Metric(key, float(value), now_ms, 0) for key, value in sorted(figures.items())])


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED") -> None:
    """Mark a stage (or the parent) run finished, failed or killed; repeating it is harmless."""
    if status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
    with reported(tracking_uri, f"ending run {run_id}"):
        client(tracking_uri).set_terminated(run_id, status=status)


def log_stage_commands(tracking_uri: str, run_id: str, commands: Mapping[str, str]) -> list[str]:
    """Store rendered commands/files (``{"rl.sh": "...", "tool_config.yaml": "..."}``) under ``commands/``."""
    mlflow_client = client(tracking_uri)
    paths = []
    with reported(tracking_uri, f"logging the rendered commands of run {run_id}"):
        for file_name, text in commands.items():
            if "/" in file_name or file_name in ("", ".", ".."):
                raise ValueError(f"command file name {file_name!r} must be a plain file name")
            mlflow_client.log_text(run_id, text, f"commands/{file_name}")
            paths.append(f"commands/{file_name}")
    return paths


def stage_env(tracking_uri: str, experiment: str, run_id: str) -> dict[str, str]:
    """Environment that makes verl (``trainer.logger`` with mlflow) log into the stage's run.

    verl calls ``mlflow.set_experiment(trainer.project_name)`` then ``mlflow.start_run()``, which
    resumes ``MLFLOW_RUN_ID``; so trainer.project_name must be the same experiment name.
    """
    return {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_EXPERIMENT_NAME": experiment, "MLFLOW_RUN_ID": run_id}


@dataclass(frozen=True)
class StageRun:
    run_id: str
    experiment: str
    env: dict[str, str]
    """Add to the stage command's environment (see :func:`stage_env`)."""


def prepare_stage_run(ctx: StageContext, stage: str, *, commands: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None) -> StageRun | None:
    """What a stage entrypoint calls before running its command; None when the run is not tracked.

    Finds or creates the run of this attempt under ``ctx.mlflow_parent_run_id`` (tagged with the
    image), stores the rendered commands, and returns the environment that points verl at it.
    After the command exits, call ``end_run(uri, run_id, "FINISHED" or "FAILED")``.
    """
    uri, parent_run_id = ctx.mlflow_tracking_uri, ctx.mlflow_parent_run_id
    if not uri or not parent_run_id:
        return None
    run_tags = {naming.TAG_IMAGE: ctx.image} if ctx.image else {}
    run_tags.update(tags or {})
    run_id = start_stage_run(uri, parent_run_id, stage, ctx.attempt, run_tags)
    experiment = ctx.mlflow_experiment
    if not experiment:
        mlflow_client = client(uri)
        with reported(uri, f"reading the experiment of run {parent_run_id}"):
            experiment = mlflow_client.get_experiment(mlflow_client.get_run(parent_run_id).info.experiment_id).name
    if commands:
        log_stage_commands(uri, run_id, commands)
    return StageRun(run_id=run_id, experiment=experiment, env=stage_env(uri, experiment, run_id))


RAY_ENV_PREFIX = "+ray_kwargs.ray_init.runtime_env.env_vars."


def ray_env_overrides(env: Mapping[str, str]) -> list[str]:
    """Hydra overrides that hand ``env`` to every Ray worker of ``verl.trainer.main_ppo``.

    verl's trainer (and its MLflow logger) runs in a Ray actor, which inherits the environment of
    the Ray node (the pod), not of the driver process the stage entrypoint starts; variables
    known only at run time (``MLFLOW_RUN_ID`` from :func:`prepare_stage_run`) must travel in the
    job's runtime_env. Not needed when the operator puts them in the pods' environment.
    """
    overrides = []
    for key, value in sorted(env.items()):
        if not key.isidentifier():
            raise ValueError(f"{key!r} is not an environment variable name")
        if "'" in value or "\\" in value:
            raise ValueError(f"the value of {key} cannot be passed as a Hydra override: {value!r}")
        overrides.append(f"{RAY_ENV_PREFIX}{key}='{value}'")
    return overrides
