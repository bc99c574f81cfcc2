"""Renderers of the stages that are not verl Hydra PPO runs: prepare, sft (torchrun) and merge."""

from __future__ import annotations

import posixpath
from typing import Any

from retool.recipe.render import ascend
from retool.recipe.render.command import LATEST, RenderError, StageCommand, hydra_overrides
from retool.recipe.render.common import (
    CPU_ONLY_MODULE,
    MAX_CHECKPOINTS_KEPT,
    MERGER_MODULE,
    PYTHON,
    RAY_TORCHRUN_MODULE,
    SFT_MODULE,
    STAGING_MODULE,
    TORCHRUN_PORT,
    cpu_stage_env,
    experiment_name,
    loggers,
    model_path,
    model_source_notes,
    process_env,
    stage_run_name,
)
from retool.recipe.render.profiles import engine_profile
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun

# --------------------------------------------------------------------------------- prepare


STEPS_PER_EPOCH = "<steps_per_epoch>"
"""Stands for the SFT save frequency when ``sft.saveFreq`` is unset (one save per epoch).

Steps per epoch follow from the prepared data's row count, known only on the PVC, so the
renderer (pure) writes this token and the stage entrypoint replaces it (``retool.runtime.sft_plan``)."""


def prepare_env(run: RetoolRun) -> dict[str, str]:
    """The prepare stage downloads (data sets, the model): the hub endpoint, and no NPU."""
    env = cpu_stage_env(run, offline=False)
    if run.spec.model.hub_endpoint:
        env["HF_ENDPOINT"] = run.spec.model.hub_endpoint
    return env


def render_prepare(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    """Data first (fails fast on bad input), then the model staged once onto the PVC."""
    # Both through retool.runtime.cpu_only: the pod has no accelerator (on Ascend no NPU driver, so
    # torch_npu, which datasets/transformers import when installed, cannot load).
    data = (PYTHON, "-m", CPU_ONLY_MODULE, "-m", "retool.cli", "data", "prepare", "all", "--spec", spec_file)
    staging = (PYTHON, "-m", CPU_ONLY_MODULE, "-m", STAGING_MODULE, "--spec", spec_file)
    notes = model_source_notes(run)
    if run.spec.model.token_secret_ref is not None:
        ref = run.spec.model.token_secret_ref
        notes += (f"HF_TOKEN comes from Secret {ref.name} (key {ref.key}), set by the operator",)
    return StageCommand(stage="prepare", pre=(data,), argv=staging, env=prepare_env(run), notes=notes)


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
        "model.partial_pretrain": model_path(run),
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
        # Unset: once per epoch, resolved from the data when the stage starts (STEPS_PER_EPOCH).
        "trainer.save_freq": STEPS_PER_EPOCH if sft.save_freq is None else sft.save_freq,
        # verl keeps every SFT checkpoint by default (params + optimizer, ~12 bytes per parameter
        # each); the run's claim is sized for this many (operator builders/storage.py), merge needs
        # only the last.
        "trainer.max_ckpt_to_keep": MAX_CHECKPOINTS_KEPT,
        "trainer.nnodes": hw.nodes,
        "trainer.n_gpus_per_node": hw.devices_per_node,
        # A retry resumes from the latest checkpoint; the stage entrypoint guards verl's epoch-boundary
        # resume (verl issue #7401) by pointing resume_path at a copy without the exhausted dataloader state.
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
    if run.spec.sft.save_freq is None:
        notes += (f"{STEPS_PER_EPOCH} (one checkpoint per epoch) is computed from the prepared SFT data when the stage starts",)
    notes += ("a retry resumes from the latest checkpoint; one that ends an epoch is resumed without its exhausted loader state (verl issue #7401)",)
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
    """verl's FSDP -> Hugging Face merge of one checkpoint directory (``global_step_N[/actor]``).

    The merger runs on CPU through ``retool.runtime.cpu_only``, which keeps torch_npu out of the
    process: on an Ascend node without an NPU it would fail to load the driver library.
    """
    argv = (PYTHON, "-m", CPU_ONLY_MODULE, "-m", MERGER_MODULE, "merge", "--backend", "fsdp", "--local_dir", checkpoint_dir, "--target_dir", target_dir)
    return (*argv, "--trust-remote-code") if run.spec.model.trust_remote_code else argv


def render_merge(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    if not run.spec.sft.enabled:
        raise RenderError("spec.sft.enabled is false: the merge stage is skipped (the RL checkpoint is merged by the eval stage)")
    paths = run_paths(run)
    # The SFT trainer writes its shards straight into global_step_N (no actor/ sub-directory).
    argv = merge_argv(posixpath.join(paths.sft_checkpoints, f"global_step_{LATEST}"), paths.sft_merged, run)
    notes = (f"{LATEST} is the step in {paths.sft_checkpoints}/latest_checkpointed_iteration.txt, read when the stage starts",)
    return StageCommand(stage="merge", argv=argv, env=cpu_stage_env(run), notes=notes, checkpoint_source=(paths.sft_checkpoints, ""))
