"""Values every stage renderer shares: names, MLflow wiring, process environment, tool config."""

from __future__ import annotations

import posixpath

from retool.recipe import verl_plugins
from retool.recipe.render import ascend
from retool.recipe.render.command import RenderError
from retool.recipe.render.profiles import engine_profile
from retool.recipe.tool.config import tool_config_yaml
from retool.recipe.verl_plugins import v0_9
from retool.runtime.context import ENV_SANDBOX_URL, StageContext
from retool.runtime.paths import RunPaths, cache_env, run_paths, staged_model_path
from retool.spec.model import RetoolRun

PYTHON = "python3"
SFT_MODULE = "verl.trainer.fsdp_sft_trainer"
PPO_MODULE = verl_plugins.PPO_MAIN_MODULE
MERGER_MODULE = "verl.model_merger"
RAY_TORCHRUN_MODULE = "retool.runtime.ray_torchrun"
STAGING_MODULE = "retool.staging"
CPU_ONLY_MODULE = "retool.runtime.cpu_only"
TOOL_CONFIG_FILE = "tool_config.yaml"
DATASET_CLASS = (verl_plugins.DATASET_CLASS_PATH, verl_plugins.DATASET_CLASS_NAME)
REWARD_FUNCTION = (verl_plugins.REWARD_FILE, verl_plugins.REWARD_FUNCTION_NAME)
MAX_CHECKPOINTS_KEPT = 2
"""RL checkpoints kept (a 32B actor with optimizer state is hundreds of GB); resume needs only the
latest, the one before covers a checkpoint cut off while being written."""
TORCHRUN_PORT = 29500
CPU_ENV: dict[str, str] = {"VERL_PLATFORM": v0_9.CPU_PLATFORM, "VERL_USE_EXTERNAL_MODULES": v0_9.CPU_MODULE}
"""Every trainer process of a CPU rehearsal loads our CPU adaptation of verl (retool.recipe.render.cpu)."""


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
    """Environment every trainer process needs beyond the pod's (accelerator switches, caches, MLflow).

    The model is read from its staged copy on the PVC, so nothing after prepare talks to the hub
    (``HF_HUB_OFFLINE``): a stage that would download instead fails at once, naming the file.
    """
    env = {"PYTHONUNBUFFERED": "1", **cache_env(run_paths(run)), "HF_HUB_OFFLINE": "1"}
    if run.spec.hardware.accelerator == "ascend":
        env.update(ascend.ASCEND_ENV)
    if run.spec.hardware.accelerator == "cpu":
        env.update(CPU_ENV)
    if ctx.mlflow_tracking_uri:
        env["MLFLOW_TRACKING_URI"] = ctx.mlflow_tracking_uri
    return env


def cpu_stage_env(run: RetoolRun, *, offline: bool = True) -> dict[str, str]:
    """Environment of the stages that use no accelerator (prepare, merge, preflight).

    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: torch loads every installed device backend (the
    ``torch.backends`` entry points: torch_npu in the Ascend image) on ``import torch``, and
    torch_npu fails there without the NPU driver, which the Ascend runtime mounts only into
    containers given NPUs. These stages import torch (datasets, the merger) but never use a device.
    """
    env = {"PYTHONUNBUFFERED": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **cache_env(run_paths(run))}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def model_path(run: RetoolRun) -> str:
    """The base model as every stage after prepare reads it (``retool.runtime.paths.staged_model_path``)."""
    return staged_model_path(run)


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
    if not ctx.sandbox_url:
        raise RenderError(f"stage environment lacks {ENV_SANDBOX_URL} (set by the retool operator): the code interpreter needs the run's sandbox")
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
    """Where the base model a command reads comes from."""
    model = run.spec.model
    if model.base.startswith("/"):
        return (f"the base model is read in place from the PVC path {model.base} (checked by the prepare stage)",)
    revision = f" at revision {model.revision}" if model.revision else ""
    return (f"the base model {model.base}{revision} is read from its copy at {staged_model_path(run)}, staged and verified by the prepare stage",)
