"""Every rendered stage of every example and variant composes against verl 0.6.1's own config.

Three levels, each closer to what the real program does at start-up:
1. Hydra composition in struct mode (an unknown or misspelled key fails);
2. every override reads back from the composed config as exactly the value the renderer meant
   (so quoting and typing survived Hydra's grammar);
3. verl's own start-up checks on the composed PPO config (``verl.utils.config.validate_config``:
   batch sizes against devices, micro-batch settings, critic, sampling), as ``main_ppo`` runs them.
"""

from __future__ import annotations

import functools

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from retool.recipe.render.command import StageCommand, hydra_overrides
from retool.recipe.render.ppo import REWARD_KWARGS_PREFIX, RUNTIME_ENV_PREFIX, SANDBOX_FAILURE_SHARE_KEY, WATCH_PREFIX
from retool.recipe.render.stages import enabled_stages, render_stage
from tests.render.cases import VARIANTS, context_of, run_of
from tests.render.verl_config import compose_verl

HYDRA_STAGES = ("sft", "rl", "eval")
CASES = [
    pytest.param(variant, stage, id=f"{variant}-{stage}")
    for variant in VARIANTS
    for stage in HYDRA_STAGES
    if stage in enabled_stages(run_of(variant))
]


@functools.cache
def _rendered(variant: str, stage: str) -> tuple[StageCommand, DictConfig]:
    """The command and its composed config, composed once per session (composition is the slow part)."""
    run = run_of(variant)
    command = render_stage(run, stage, context_of(run))
    assert command.config_name is not None
    return command, compose_verl(command.config_name, hydra_overrides(command.overrides))


def _read_back(cfg, key: str):
    value = OmegaConf.select(cfg, key.lstrip("+"), throw_on_missing=True)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


@pytest.mark.parametrize(("variant", "stage"), CASES)
def test_rendered_overrides_compose_and_read_back_exactly(variant: str, stage: str) -> None:
    command, cfg = _rendered(variant, stage)
    assert command.config_name == ("sft_trainer" if stage == "sft" else "ppo_trainer")
    assert command.argv[-len(command.overrides) :] == hydra_overrides(command.overrides), "argv must end with exactly the rendered overrides"
    for key, expected in command.overrides.items():
        got = _read_back(cfg, key)
        assert got == (list(expected) if isinstance(expected, tuple) else expected), key
        assert type(got) is type(expected) or isinstance(expected, (list, tuple)), f"{key}: {type(got).__name__} != {type(expected).__name__}"


@pytest.mark.parametrize(("variant", "stage"), [c for c in CASES if c.values[1] != "sft"])
def test_only_ray_runtime_env_keys_reward_kwargs_the_reward_watch_and_the_failure_bound_are_added_outside_verls_schema(variant: str, stage: str) -> None:
    run = run_of(variant)
    command = render_stage(run, stage, context_of(run))
    watch = {key.removeprefix(WATCH_PREFIX): value for key, value in command.overrides.items() if key.startswith(WATCH_PREFIX)}
    expected_watch = {**run.spec.rl.reward_watch.model_dump(by_alias=False), "horizon": run.spec.rl.steps}
    assert watch == expected_watch, "spec.rl.rewardWatch reaches the trainer's reward watch as it is, with the run's steps as the alarm's horizon"
    assert command.overrides[SANDBOX_FAILURE_SHARE_KEY] == run.spec.rl.max_sandbox_failure_share, "spec.rl.maxSandboxFailureShare reaches the trainer's masking"
    added = [key for key in command.overrides if key.startswith("+") and not key.startswith((REWARD_KWARGS_PREFIX, WATCH_PREFIX)) and key != SANDBOX_FAILURE_SHARE_KEY]
    assert added, "the process environment must reach every Ray worker"
    assert all(key.startswith(RUNTIME_ENV_PREFIX) for key in added)
    assert {key.removeprefix(RUNTIME_ENV_PREFIX) for key in added} == set(command.env)
    reward_kwargs = {key.removeprefix(REWARD_KWARGS_PREFIX): value for key, value in command.overrides.items() if key.startswith(REWARD_KWARGS_PREFIX)}
    expected = {"tool_turn_shaping": True} if stage == "rl" and run.spec.rl.tool_turn_shaping else {}
    assert reward_kwargs == expected, "spec.rl.toolTurnShaping reaches the reward of the rl stage, and only there"


REWARD_FROM_CONFIG = """
import json, sys
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn
fn = get_custom_reward_fn(OmegaConf.create({"custom_reward_function": json.loads(sys.argv[1])}))
print(json.dumps(fn(data_source="dapo", solution_str="\\\\boxed{1}", ground_truth="2", extra_info={"num_turns": 6})))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "score"), [("qwen32b-tool-turn-shaping", -0.8), ("qwen32b-h200", -1.0)], ids=["shaping on", "shaping off"])
def test_tool_turn_shaping_reaches_compute_score_through_verls_loader(variant: str, score: float) -> None:
    """The composed rl config, handed to verl's own reward loader, shapes a wrong answer with two tool calls."""
    import json
    import subprocess
    import sys

    from tests.conftest import repo_env

    _, cfg = _rendered(variant, "rl")
    section = json.dumps(OmegaConf.to_container(cfg.custom_reward_function, resolve=True))
    proc = subprocess.run([sys.executable, "-c", REWARD_FROM_CONFIG, section], env=repo_env(), capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["score"] == pytest.approx(score)


@pytest.mark.parametrize(("variant", "stage"), [c for c in CASES if c.values[1] != "sft"])
def test_composed_ppo_config_passes_verls_startup_validation(variant: str, stage: str) -> None:
    from verl.trainer.config import AlgoConfig
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    command, cfg = _rendered(variant, stage)
    rl = run_of(variant).spec.rl
    validate_config(cfg, use_reference_policy=rl.use_kl_loss or rl.use_kl_in_reward, use_critic=rl.algorithm == "ppo")
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig)
    if run_of(variant).spec.recipe == "tool-integrated":
        assert rollout.multi_turn.enable and rollout.multi_turn.tool_config_path == next(iter(command.files))
        assert rollout.agent.default_agent_loop == "tool_agent"
    else:  # the text-only baseline: one plain generation, no tool anywhere
        assert not rollout.multi_turn.enable and rollout.multi_turn.tool_config_path is None and command.files == {}
        assert rollout.agent.default_agent_loop == "single_turn_agent"
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    assert isinstance(algorithm, AlgoConfig)
    assert algorithm.adv_estimator == ("grpo" if rl.algorithm == "grpo" else "gae")


@pytest.mark.parametrize(
    ("config_name", "override", "match"),
    [
        pytest.param("ppo_trainer", "trainer.loger=['console']", "trainer.loger", id="ppo-misspelled-trainer-key"),
        pytest.param("ppo_trainer", "actor_rollout_ref.rollout.multi_turn.max_turns=8", "max_turns", id="ppo-key-verl-does-not-have"),
        pytest.param("ppo_trainer", "trainer.rollout_trace.backend=mlflow", "rollout_trace", id="ppo-trace-under-trainer-is-not-0.6.1"),
        pytest.param("sft_trainer", "data.multiturn.enabled=True", "enabled", id="sft-misspelled-nested-key"),
        pytest.param("sft_trainer", "ulysses_sequence_paralel_size=4", "paralel", id="sft-misspelled-top-level-key"),
    ],
)
def test_a_misspelled_key_fails_composition(config_name: str, override: str, match: str) -> None:
    with pytest.raises(ConfigCompositionException, match=match):
        compose_verl(config_name, [override])


def test_a_corrupted_rendered_command_fails_composition() -> None:
    """The same check as above, applied to a real rendered override set with one key misspelled."""
    run = run_of("qwen32b-h200")
    overrides = dict(render_stage(run, "rl", context_of(run)).overrides)
    overrides["actor_rollout_ref.rollout.tensor_parallel_size"] = overrides.pop("actor_rollout_ref.rollout.tensor_model_parallel_size")
    with pytest.raises(ConfigCompositionException, match="tensor_parallel_size"):
        compose_verl("ppo_trainer", hydra_overrides(overrides))


def test_verl_validation_catches_a_batch_the_devices_cannot_split() -> None:
    """Level 3 is not vacuous: verl rejects what the spec rules would also reject."""
    from verl.utils.config import validate_config

    run = run_of("qwen32b-h200")
    overrides = dict(render_stage(run, "rl", context_of(run)).overrides)
    overrides.update(
        {
            "actor_rollout_ref.actor.use_dynamic_bsz": False,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
            "data.train_batch_size": 1,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
            "actor_rollout_ref.rollout.n": 1,
        }
    )
    cfg = compose_verl("ppo_trainer", hydra_overrides(overrides))
    with pytest.raises(AssertionError, match="divisible"):
        validate_config(cfg, use_reference_policy=False, use_critic=False)


class _Mesh:
    """The two calls verl's batch normalisation makes on a device mesh."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self, dim: int = 0) -> int:
        return self._size

    def get_rank(self) -> int:
        return 0


@pytest.mark.parametrize(("variant", "stage"), [c for c in CASES if c.values[1] == "sft"])
def test_composed_sft_config_passes_verls_batch_normalisation(variant: str, stage: str) -> None:
    """verl's own FSDPSFTTrainer._normalize_config_bsz on the composed config, with the run's meshes."""
    from types import SimpleNamespace

    from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer

    command, cfg = _rendered(variant, stage)
    cfg = cfg.copy()
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    dp = world // cfg.ulysses_sequence_parallel_size
    trainer = SimpleNamespace(config=cfg, device_mesh=_Mesh(world), ulysses_device_mesh=_Mesh(dp))
    FSDPSFTTrainer._normalize_config_bsz(trainer)
    assert cfg.data.train_batch_size * dp == command.overrides["data.train_batch_size"]


def test_verls_sft_batch_normalisation_rejects_micro_batches_that_do_not_fit() -> None:
    from types import SimpleNamespace

    from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer

    command, _ = _rendered("qwen32b-h200", "sft")
    overrides = {**command.overrides, "data.train_batch_size": 30}
    cfg = compose_verl("sft_trainer", hydra_overrides(overrides))
    with pytest.raises(AssertionError):
        FSDPSFTTrainer._normalize_config_bsz(SimpleNamespace(config=cfg, device_mesh=_Mesh(8), ulysses_device_mesh=_Mesh(2)))
