"""What the stage entrypoint does around the verl command: MLflow stage runs, eval results,
model registration and the S3 mirror.

Kept apart from ``retool.stage`` so that the rendering-and-running path stays small and these
side effects can be tested against real servers one by one. Tracking is best effort before the
command (an unreachable MLflow server must not cost a day of training: the command then runs
untracked, with a warning), but results are reported as failures after it, because the operator
reads ``status.results`` from the eval run.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import replace

from retool.recipe.render.command import StageCommand
from retool.recipe.render.ppo import RUNTIME_ENV_PREFIX, final_model_path
from retool.runtime.completion import EVAL_DUMP
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun
from retool.tracking import naming
from retool.tracking._client import TrackingError, client, reported
from retool.tracking.evaluation import log_eval_results, read_sample_rows
from retool.tracking.headline import log_headline
from retool.tracking.registry import register_final_model
from retool.tracking.runs import StageRun, end_run, prepare_stage_run, ray_env_overrides

log = logging.getLogger("retool.stage")

FAILURE_TAG = "retool.failure"
"""Tag on a failed stage run: why it failed, when the stage knows (e.g. a trainer that stopped early)."""


HEADLINE_STAGES = ("rl", "eval")
"""Stages after which the parent run's headline metrics are refreshed (:mod:`retool.tracking.headline`)."""

def with_tracking_env(command: StageCommand, tracked: StageRun) -> StageCommand:
    """The command with the stage run's MLflow environment, also handed to every Ray worker.

    verl's trainer runs in a Ray actor that inherits the pod's environment, not the driver's, so
    for Hydra entry points the variables also travel in the job's runtime_env (skipping any the
    renderer already put there: Hydra refuses to add a key twice).
    """
    env = {**command.env, **tracked.env}
    if command.config_name != "ppo_trainer":
        return replace(command, env=env)
    missing = {key: value for key, value in tracked.env.items() if f"{RUNTIME_ENV_PREFIX}{key}" not in command.overrides}
    extra = ray_env_overrides(missing)
    overrides = dict(command.overrides)
    for item in extra:
        key, _, value = item.partition("=")
        overrides[key] = value.strip("'")
    return replace(command, env=env, argv=(*command.argv, *extra), overrides=overrides)


def start(ctx: StageContext, stage: str, command: StageCommand) -> tuple[StageCommand, StageRun | None]:
    """Open (or find, on a retry of the same attempt) this attempt's MLflow run under the parent."""
    try:
        tracked = prepare_stage_run(ctx, stage, commands={"command.sh": command.script()})
    except TrackingError as err:
        log.warning("MLflow is unavailable, the %s stage runs untracked: %s", stage, err)
        return command, None
    if tracked is None:
        log.info("no MLflow parent run in the stage context: the %s stage runs untracked", stage)
        return command, None
    return with_tracking_env(command, tracked), tracked


def mirror_targets(run: RetoolRun, stage: str) -> list[tuple[str, str]]:
    """(PVC directory, s3 URI) pairs a successful stage copies to ``storage.s3`` (empty without it)."""
    s3 = run.spec.storage.s3
    if s3 is None:
        return []
    paths = run_paths(run)
    outputs = {
        "sft": [paths.sft_checkpoints],
        "merge": [paths.sft_merged],
        "rl": [paths.rl_checkpoints],
        "eval": [paths.rl_merged, paths.eval_output] if run.spec.rl.enabled else [paths.eval_output],
    }.get(stage, [])
    base = s3.uri.rstrip("/")
    return [(local, f"{base}/{posixpath.relpath(local, paths.root)}") for local in outputs]


def mirror(run: RetoolRun, stage: str) -> dict[str, str]:
    """Copy the stage's outputs to S3 (verified, resumable); returns local -> URI of what was copied."""
    from retool.storage import upload_dir

    s3 = run.spec.storage.s3
    copied = {}
    for local, uri in mirror_targets(run, stage):
        report = upload_dir(local, uri, endpoint_url=s3.endpoint if s3 else None, region=s3.region if s3 else None)
        log.info("mirrored %s to %s (%s)", local, uri, report)
        copied[local] = uri
    return copied


def report_eval(run: RetoolRun, ctx: StageContext, tracked: StageRun, copied: dict[str, str]) -> dict[str, dict[str, float]]:
    """Log the eval metrics and samples on the eval run, then register the evaluated model."""
    assert ctx.mlflow_tracking_uri is not None
    rows = read_sample_rows(posixpath.join(run_paths(run).eval_output, EVAL_DUMP))
    results = log_eval_results(ctx.mlflow_tracking_uri, tracked.run_id, rows).results
    log.info("eval results: %s", results)
    mlflow = run.spec.tracking.mlflow
    model_dir = final_model_path(run)
    if mlflow.register_model and model_dir.startswith("/"):
        version = register_final_model(
            ctx.mlflow_tracking_uri,
            run_id=tracked.run_id,
            model_name=naming.registered_model_name(run.metadata.name, mlflow.registered_model_name),
            model_dir=model_dir,
            results=results,
            model_uri=copied.get(model_dir),
        )
        log.info("registered %s version %s", version.name, version.version)
    return results


def finish(run: RetoolRun, ctx: StageContext, stage: str, tracked: StageRun | None, status: int, *, failure: str | None = None) -> int:
    """After the command: mirror, report and close the stage run. Returns the stage's exit status.

    ``failure`` is the reason a stage that exited 0 did not do its work; the run is then FAILED
    with the reason as its ``retool.failure`` tag, and nothing is mirrored or reported.
    """
    if status == 0:
        try:
            copied = mirror(run, stage)
            if stage == "eval" and tracked is not None:
                report_eval(run, ctx, tracked, copied)
        except Exception as err:  # any failure here (S3, MLflow, a missing dump) fails the stage, with its reason
            failure = f"the {stage} command succeeded but its outputs could not be reported: {err}"
            log.error("%s", failure)
            status = 1
    if status == 0 and stage in HEADLINE_STAGES and tracked is not None and ctx.mlflow_tracking_uri and ctx.mlflow_parent_run_id:
        try:  # the figures MLflow's compare view shows on parent runs; the stage's own outcome does not depend on them
            log_headline(ctx.mlflow_tracking_uri, ctx.mlflow_parent_run_id)
        except TrackingError as err:
            log.warning("could not log the headline metrics on parent run %s: %s", ctx.mlflow_parent_run_id, err)
    if tracked is not None and ctx.mlflow_tracking_uri:
        try:
            if failure is not None:
                with reported(ctx.mlflow_tracking_uri, f"tagging run {tracked.run_id}"):
                    client(ctx.mlflow_tracking_uri).set_tag(tracked.run_id, FAILURE_TAG, failure[:5000])
            end_run(ctx.mlflow_tracking_uri, tracked.run_id, "FINISHED" if status == 0 else "FAILED")
        except TrackingError as err:
            log.warning("could not close MLflow run %s: %s", tracked.run_id, err)
    return status
