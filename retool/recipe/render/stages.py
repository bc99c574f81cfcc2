"""Render a RetoolRun stage into the exact command a stage pod runs.

``render_stage(run, stage, ctx)`` is pure: everything comes from the parsed spec, the stage
context the operator provides (sandbox URL, MLflow, attempt) and the run's PVC layout
(``retool.runtime.paths``). Nothing is read from the environment or the filesystem, so the same
call gives the command that ``retool render`` shows, that the tests compose against verl's own
Hydra configuration, and that ``retool.stage`` executes.

Stages and where they hand over on the PVC:

- prepare: ``python -m retool.cli data prepare all`` writes the SFT, RL and eval parquet files.
- sft: verl's multi-turn FSDP SFT trainer (``verl.trainer.fsdp_sft_trainer``) under torchrun,
  checkpoints in ``checkpoints/sft``. verl 0.6.1 has no Ray-based SFT trainer, so on more than
  one node ``retool.runtime.ray_torchrun`` starts one torchrun per node of the RayJob's cluster.
- merge: ``verl.model_merger`` turns the latest SFT checkpoint into a Hugging Face model
  (``models/sft``), the RL stage's starting point.
- rl: ``verl.trainer.main_ppo`` (GRPO, or PPO with a GAE critic) with multi-turn tool rollouts,
  checkpoints in ``checkpoints/rl``; a retry resumes from the latest (``resume_mode=auto``).
- eval: first merges the latest RL checkpoint into ``models/rl`` (the merge stage runs before RL,
  so the final merge belongs to the stage that needs it), then a validation-only main_ppo run
  that dumps every sample to ``eval/0.jsonl`` for mean@k / maj@k / pass@k.
"""

from __future__ import annotations

from collections.abc import Callable

from retool.preflight.command import render_preflight
from retool.recipe.render import cpu, v0_9
from retool.recipe.render.command import RenderError, StageCommand
from retool.recipe.render.ppo import render_eval, render_rl
from retool.recipe.render.sft import render_merge, render_prepare, render_sft
from retool.runtime.context import SPEC_MOUNT_PATH, StageContext
from retool.spec.model import RetoolRun
from retool.spec.names import STAGES


def enabled_stages(run: RetoolRun) -> tuple[str, ...]:
    """The stages this run executes, in order (sft and merge go together)."""
    spec = run.spec
    enabled = {"prepare": True, "preflight": spec.preflight.enabled, "sft": spec.sft.enabled, "merge": spec.sft.enabled, "rl": spec.rl.enabled, "eval": spec.eval.enabled}
    return tuple(stage for stage in STAGES if enabled[stage])


RENDERERS: dict[str, Callable[[RetoolRun, StageContext, str], StageCommand]] = {
    "prepare": render_prepare,
    "sft": render_sft,
    "merge": render_merge,
    "rl": lambda run, ctx, _spec_file: render_rl(run, ctx),
    "eval": lambda run, ctx, _spec_file: render_eval(run, ctx),
    "preflight": render_preflight,
}


def render_stage(run: RetoolRun, stage: str, ctx: StageContext, *, spec_file: str = SPEC_MOUNT_PATH) -> StageCommand:
    """The command of ``stage`` for ``run`` (``RenderError`` for a disabled stage or an impossible spec)."""
    if stage not in RENDERERS:
        raise RenderError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    if ctx.run_name != run.metadata.name:
        raise RenderError(f"stage context is for run {ctx.run_name!r}, the spec is {run.metadata.name!r}")
    command = RENDERERS[stage](run, ctx, spec_file)
    # One override set per spec; the 0.9 line moves it onto verl 0.9.1 (retool.recipe.render.v0_9),
    # and a CPU rehearsal (0.9 line only, the spec rules) changes what a CPU cannot run (retool.recipe.render.cpu).
    if run.spec.trainer.verl == v0_9.LINE:
        command = v0_9.adapt(command)
    return cpu.adapt(command, run, ctx) if run.spec.hardware.accelerator == "cpu" else command
