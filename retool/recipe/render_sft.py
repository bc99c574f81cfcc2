"""Renderers of the stages that are not verl Hydra PPO runs: prepare, sft (torchrun) and merge."""

from __future__ import annotations

import posixpath
from typing import Any

from retool.recipe import ascend
from retool.recipe.command import LATEST, RenderError, StageCommand, hydra_overrides
from retool.recipe.profiles import engine_profile
from retool.recipe.render_common import (
    MERGER_MODULE,
    PYTHON,
    RAY_TORCHRUN_MODULE,
    SFT_MODULE,
    TORCHRUN_PORT,
    experiment_name,
    loggers,
    model_source_notes,
    process_env,
    stage_run_name,
)
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun

# --------------------------------------------------------------------------------- prepare


def render_prepare(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    argv = (PYTHON, "-m", "retool.cli", "data", "prepare", "all", "--spec", spec_file)
    return StageCommand(stage="prepare", argv=argv, env={"PYTHONUNBUFFERED": "1"})


# ------------------------------------------------------------------------------------- sft


def sft_overrides(run: RetoolRun, ctx: StageContext) -> dict[str, Any]:
    spec, paths, profile = run.spec, run_paths(run), engine_profile(run.spec)
    sft, hw = spec.sft, spec.hardware
    overrides: dict[str, Any] = {
        "data.train_files": paths.sft_train,
        # The recipe validates on its training file: one pass at the end reports val/loss.
        "data.val_files": paths.sft_train,
        "data.train_batch_size": sft.batch_size,
        "data.micro_batch_size_per_gpu": sft.micro_batch_size_per_device,
        "data.max_length": sft.max_length,
        # A trajectory over maxLength loses its tail instead of stopping the run hours in.
        "data.truncation": "right",
        "data.multiturn.enable": True,
        "data.multiturn.messages_key": "messages",
        "data.multiturn.tools_key": "tools",
        "model.partial_pretrain": spec.model.base,
        "model.trust_remote_code": spec.model.trust_remote_code,
        "model.strategy": profile.sft_strategy,
        "model.enable_gradient_checkpointing": True,
        "model.fsdp_config.cpu_offload": profile.sft_cpu_offload,
        "model.fsdp_config.offload_params": profile.sft_cpu_offload,
        "optim.lr": sft.learning_rate,
        "optim.weight_decay": sft.weight_decay,
        "ulysses_sequence_parallel_size": sft.sequence_parallel,
        "use_remove_padding": True,
        "trainer.default_local_dir": paths.sft_checkpoints,
        "trainer.project_name": experiment_name(run, ctx),
        "trainer.experiment_name": stage_run_name(ctx, "sft"),
        "trainer.logger": loggers(ctx),
        "trainer.total_epochs": sft.epochs,
        "trainer.save_freq": sft.save_freq,
        "trainer.nnodes": hw.nodes,
        "trainer.n_gpus_per_node": hw.devices_per_node,
        "trainer.resume_mode": "auto",
    }
    if hw.accelerator == "ascend":
        overrides.update(ascend.sft_overrides())
    return overrides


def render_sft(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    if not run.spec.sft.enabled:
        raise RenderError("spec.sft.enabled is false: the sft stage is skipped")
    hw = run.spec.hardware
    overrides = sft_overrides(run, ctx)
    program = ("-m", SFT_MODULE, *hydra_overrides(overrides))
    notes = model_source_notes(run)
    if hw.nodes == 1:
        argv = ("torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={hw.devices_per_node}", *program)
    else:
        argv = (
            PYTHON, "-m", RAY_TORCHRUN_MODULE,
            "--nodes", str(hw.nodes),
            "--devices-per-node", str(hw.devices_per_node),
            "--device-resource", ascend.RAY_DEVICE_RESOURCE[hw.accelerator],
            "--port", str(TORCHRUN_PORT),
            "--", *program,
        )  # fmt: skip
        notes += (f"one torchrun per node on the RayJob's {hw.nodes} nodes; the master address is the first node's IP, found at run time",)
    return StageCommand(stage="sft", argv=argv, env=process_env(run, ctx), config_name="sft_trainer", overrides=overrides, notes=notes)


# ----------------------------------------------------------------------------------- merge


def merge_argv(checkpoint_dir: str, target_dir: str, run: RetoolRun) -> tuple[str, ...]:
    """verl's FSDP -> Hugging Face merge of one checkpoint directory (``global_step_N[/actor]``)."""
    argv = (PYTHON, "-m", MERGER_MODULE, "merge", "--backend", "fsdp", "--local_dir", checkpoint_dir, "--target_dir", target_dir)
    return (*argv, "--trust-remote-code") if run.spec.model.trust_remote_code else argv


def render_merge(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    if not run.spec.sft.enabled:
        raise RenderError("spec.sft.enabled is false: the merge stage is skipped (the RL checkpoint is merged by the eval stage)")
    paths = run_paths(run)
    # The SFT trainer writes its shards straight into global_step_N (no actor/ sub-directory).
    argv = merge_argv(posixpath.join(paths.sft_checkpoints, f"global_step_{LATEST}"), paths.sft_merged, run)
    notes = (f"{LATEST} is the step in {paths.sft_checkpoints}/latest_checkpointed_iteration.txt, read when the stage starts",)
    return StageCommand(stage="merge", argv=argv, env={"PYTHONUNBUFFERED": "1"}, notes=notes, checkpoint_source=(paths.sft_checkpoints, ""))
