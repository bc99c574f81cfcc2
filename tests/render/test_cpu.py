"""A CPU rehearsal's commands (``hardware.accelerator: cpu``): the 0.9 line's GPU commands plus only what a CPU needs.

The composition of these commands against verl 0.9.1's own config is tests/verl09/test_compose.py
(variants ``smoke-on-cpu*``); here, that the CPU renderer changes nothing else.
"""

from __future__ import annotations

import pytest

from retool.recipe.render import cpu
from retool.recipe.render.command import StageCommand
from retool.recipe.render.common import CPU_ENV
from retool.recipe.render.stages import enabled_stages
from tests.render.cases import context_of
from tests.verl09.lines import rendered, run_on

VARIANT = "smoke-on-cpu"


def gpu_twin(stage: str) -> StageCommand:
    """The same run on NVIDIA with vLLM (the example the CPU variant is made from, on the 0.9 line)."""
    return rendered("smoke-qwen0.5b", stage)


PROFILE_KEYS = {
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.agent.num_workers",
}
"""Keys whose values come from the engine profile (retool.recipe.render.profiles: the cpu profile beside small-nvidia)."""


@pytest.mark.parametrize("stage", ["sft", "rl", "eval"])
def test_cpu_changes_only_its_own_keys_the_engine_profiles_and_the_rollout_engine(stage: str) -> None:
    run = run_on(VARIANT, "0.9.1")
    command, twin = rendered(VARIANT, stage), gpu_twin(stage)
    own = dict(cpu.SFT_OVERRIDES if stage == "sft" else cpu.PPO_OVERRIDES)
    if stage == "rl":
        own["trainer.rollout_data_dir"] = cpu.rollouts_dir(run, context_of(run))
    for key, value in own.items():
        assert command.overrides[key] == value, key
    env_keys = {f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}" for key in CPU_ENV}
    engine = {"actor_rollout_ref.rollout.name"} if stage != "sft" else set()
    changed = {k for k, v in command.overrides.items() if twin.overrides.get(k, object()) != v}
    assert changed <= set(own) | env_keys | engine | PROFILE_KEYS, changed - set(own) - env_keys - engine - PROFILE_KEYS
    assert set(twin.overrides) <= set(command.overrides), "the CPU render drops no key"
    if stage != "sft":
        assert command.overrides["actor_rollout_ref.rollout.name"] == "hf"
        assert command.overrides["actor_rollout_ref.rollout.agent.num_workers"] == 1
    assert command.env == {**twin.env, **CPU_ENV}


def test_cpu_environment_reaches_every_ray_worker() -> None:
    command = rendered(VARIANT, "rl")
    for key, value in CPU_ENV.items():
        assert command.overrides[f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}"] == value


@pytest.mark.parametrize("stage", ["prepare", "preflight", "merge"])
def test_stages_without_verls_trainers_are_the_gpu_runs(stage: str) -> None:
    assert stage in enabled_stages(run_on(VARIANT, "0.9.1"))
    assert rendered(VARIANT, stage) == gpu_twin(stage)


def test_a_ppo_cpu_run_gives_its_critic_the_same_changes() -> None:
    command = rendered("smoke-on-cpu-ppo", "rl")
    for key, value in cpu.CRITIC_OVERRIDES.items():
        assert command.overrides[key] == value
