"""Values every stage renderer shares: names, MLflow wiring, process environment, tool config."""

from __future__ import annotations

import posixpath
from pathlib import Path

from retool.recipe import ascend
from retool.recipe.profiles import engine_profile
from retool.recipe.tool_config import tool_config_yaml
from retool.runtime.context import StageContext
from retool.runtime.paths import RunPaths, run_paths
from retool.spec.model import RetoolRun

PYTHON = "python3"
SFT_MODULE = "verl.trainer.fsdp_sft_trainer"
PPO_MODULE = "verl.trainer.main_ppo"
MERGER_MODULE = "verl.model_merger"
RAY_TORCHRUN_MODULE = "retool.recipe.ray_torchrun"
TOOL_CONFIG_FILE = "tool_config.yaml"
RECIPE_DIR = str(Path(__file__).parent)
"""Where this package's recipe modules are installed: verl loads the reward function by file path."""

DATASET_CLASS = ("pkg://retool.recipe.dataset", "RetoolRLDataset")
REWARD_FUNCTION = ("reward.py", "compute_score")
MAX_CHECKPOINTS_KEPT = 2
"""RL checkpoints kept (a 32B actor with optimizer state is hundreds of GB); resume needs only the
latest, the one before covers a checkpoint cut off while being written."""
TORCHRUN_PORT = 29500


def experiment_name(run: RetoolRun, ctx: StageContext) -> str:
    """MLflow experiment (verl's ``trainer.project_name``): the operator's, the spec's, else ``<namespace>/<name>``."""
    return ctx.mlflow_experiment or run.spec.tracking.mlflow.experiment or f"{ctx.namespace}/{ctx.run_name}"


def stage_run_name(ctx: StageContext, stage: str) -> str:
    """MLflow run of one attempt of a stage (verl's ``trainer.experiment_name``)."""
    return f"{ctx.run_name}-{stage}-{ctx.attempt}"


def loggers(ctx: StageContext) -> list[str]:
    # Without a tracking URI verl's MLflow logger writes to a sqlite file in the pod, lost with it.
    return ["console", "mlflow"] if ctx.mlflow_tracking_uri else ["console"]


def process_env(run: RetoolRun, ctx: StageContext) -> dict[str, str]:
    """Environment every trainer process needs beyond the pod's (accelerator switches, MLflow)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if run.spec.hardware.accelerator == "ascend":
        env.update(ascend.ASCEND_ENV)
    if ctx.mlflow_tracking_uri:
        env["MLFLOW_TRACKING_URI"] = ctx.mlflow_tracking_uri
    return env


def attempt_dir(paths: RunPaths, stage: str, attempt: int) -> str:
    """``stages/<stage>-<attempt>/``: this attempt's tool config and rendered command."""
    return posixpath.join(paths.stage_files, f"{stage}-{attempt}")


def tool_config_path(paths: RunPaths, ctx: StageContext, stage: str) -> str:
    return posixpath.join(attempt_dir(paths, stage, ctx.attempt), TOOL_CONFIG_FILE)


def tool_concurrency(run: RetoolRun) -> int:
    """Executions one tool instance may have in flight.

    verl builds one tool instance in every agent-loop worker (``rollout.agent.num_workers``), each
    with its own limit, so the run's ``sandbox.maxConcurrent`` is split between them: together they
    never exceed what the sandbox replicas were sized for.
    """
    return max(1, run.spec.sandbox.max_concurrent // engine_profile(run.spec).agent_workers)


def tool_config_file(run: RetoolRun, ctx: StageContext, stage: str) -> tuple[str, str]:
    """(path, YAML) of the code-interpreter tool config pointing at this run's sandbox."""
    spec = run.spec
    content = tool_config_yaml(
        sandbox_url=ctx.sandbox_url,
        timeout_s=spec.sandbox.timeout_seconds,
        memory_limit_mb=spec.sandbox.memory_limit_mb,
        max_output_chars=spec.rl.tool_response_max_chars,
        concurrency=tool_concurrency(run),
    )
    return tool_config_path(run_paths(run), ctx, stage), content


def model_source_notes(run: RetoolRun) -> tuple[str, ...]:
    """What verl cannot do with ``model.base`` by itself (it loads a hub id or a local path, at the default revision)."""
    model = run.spec.model
    notes = []
    if model.base.startswith("s3://"):
        notes.append(f"model.base {model.base} is read by verl as a path: it must be staged onto the PVC first")
    if model.revision:
        notes.append(f"model.revision {model.revision} is not passed to verl, which loads the hub id at its default revision")
    return tuple(notes)
