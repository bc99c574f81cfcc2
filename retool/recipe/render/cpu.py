"""What the 0.9 line needs on CPU nodes (``hardware.accelerator: cpu``): the rehearsal's whole difference in one place.

A CPU run renders every stage as a GPU run would, on verl 0.9.1 (``retool.recipe.render.v0_9``),
and then changes only what a CPU cannot do (docs/rehearsal.md):

- the process environment loads our CPU adaptation of verl in every process (``VERL_PLATFORM=cpu``,
  ``VERL_USE_EXTERNAL_MODULES``: :mod:`retool.recipe.verl_plugins.v0_9.cpu`): the ``cpu`` platform,
  ``gloo`` process groups, verl's FSDP engines registered for the device ``cpu``, and the ``hf``
  rehearsal rollout engine (``retool.recipe.render.common.CPU_ENV``, in ``process_env``, so the Ray
  workers get it through the job's runtime environment too);
- ``trainer.device=cpu``; FSDP2 (``fully_shard``): FSDP1 refuses a module on CPU with
  ``sync_module_states`` (``torch/distributed/fsdp/_init_utils.py``), which verl's engine sets;
- eager attention and no padding removal: the packed (``use_remove_padding``) layout needs
  flash-attention's variable-length kernel; eager attention on a packed row would attend across
  sequences;
- no ``torch.compile`` (inductor builds C++ kernels with the host compiler: minutes on 2 cores
  before the first step, measured), no gradient checkpointing (it trades compute for device memory,
  which a CPU run does not lack);
- one reward worker and no data-loader worker processes: each is a Python process importing verl
  and torch (~10 s of CPU each), for a rehearsal's handful of rows;
- the rl stage keeps every rollout (verl's ``trainer.rollout_data_dir``: one JSON line per response,
  with its prompt, output, score and step) in the attempt's stage directory, ``rollouts/``: what a
  rehearsal is for is reading what the model did, and a few dozen responses cost nothing to keep.

The rollout engine is the spec's (``rl.rolloutEngine: hf``, which the rules require here); the
agent-loop workers come from the ``cpu`` engine profile. Pure: no verl import.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from typing import Any

from retool.recipe.render.command import StageCommand, hydra_overrides
from retool.recipe.render.common import attempt_dir
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun

EAGER = "eager"
ARR = "actor_rollout_ref"

SFT_OVERRIDES: dict[str, Any] = {
    "trainer.device": "cpu",
    "engine.strategy": "fsdp2",
    "engine.use_torch_compile": False,
    "model.use_remove_padding": False,
    "+model.override_config.attn_implementation": EAGER,
    "model.enable_gradient_checkpointing": False,
    "data.num_workers": 0,
}
"""verl 0.9.1 ``sft_trainer_engine`` keys."""

PPO_OVERRIDES: dict[str, Any] = {
    "trainer.device": "cpu",
    f"{ARR}.actor.strategy": "fsdp2",
    f"{ARR}.ref.strategy": "fsdp2",
    f"{ARR}.actor.use_torch_compile": False,
    f"{ARR}.actor.fsdp_config.use_torch_compile": False,
    f"{ARR}.ref.fsdp_config.use_torch_compile": False,
    f"{ARR}.model.use_remove_padding": False,
    f"+{ARR}.model.override_config.attn_implementation": EAGER,
    f"{ARR}.model.enable_gradient_checkpointing": False,
    "reward.num_workers": 1,
    "data.dataloader_num_workers": 0,
    "+ray_kwargs.ray_init.include_dashboard": False,
}
"""verl 0.9.1 ``ppo_trainer`` keys of the rl and eval stages.

``include_dashboard``: a driver without ``RAY_ADDRESS`` (the rehearsal's) starts Ray itself, and its
dashboard would take 127.0.0.1:8265, the port a machine's own Ray head expects (the end-to-end
RayJob scenario's, beside it in ``make test``). A driver that joins a RayJob's head passes it to
``ray.init``, which ignores it when it connects (``ray/_private/worker.py``, Ray 2.60)."""

CRITIC_OVERRIDES: dict[str, Any] = {
    "critic.strategy": "fsdp2",
    "critic.fsdp.use_torch_compile": False,
    "critic.model.use_remove_padding": False,
    "+critic.model.override_config.attn_implementation": EAGER,
    "critic.model.enable_gradient_checkpointing": False,
}
"""A ppo run's critic (GAE), same reasons."""


def _with_overrides(command: StageCommand, added: dict[str, Any]) -> StageCommand:
    """``command`` with ``added`` merged into its Hydra overrides (a key it has keeps its place, with the new value)."""
    old = hydra_overrides(command.overrides)
    head = command.argv[: len(command.argv) - len(old)]
    overrides = {**command.overrides, **added}
    return replace(command, argv=(*head, *hydra_overrides(overrides)), overrides=overrides)


ROLLOUTS_DIR = "rollouts"


def rollouts_dir(run: RetoolRun, ctx: StageContext) -> str:
    """Where the rl stage of a CPU run keeps its rollouts: ``stages/rl-<attempt>/rollouts/<step>.jsonl``."""
    return posixpath.join(attempt_dir(run_paths(run), "rl", ctx.attempt), ROLLOUTS_DIR)


def adapt(command: StageCommand, run: RetoolRun, ctx: StageContext) -> StageCommand:
    """A 0.9-line ``command`` as a CPU run executes it (stages without verl's trainers are unchanged)."""
    if command.stage == "sft":
        return _with_overrides(command, SFT_OVERRIDES)
    if command.stage in ("rl", "eval"):
        added = dict(PPO_OVERRIDES)
        if command.overrides.get("critic.enable"):
            added.update(CRITIC_OVERRIDES)
        if command.stage == "rl":
            added["trainer.rollout_data_dir"] = rollouts_dir(run, ctx)
        return _with_overrides(command, added)
    return command
