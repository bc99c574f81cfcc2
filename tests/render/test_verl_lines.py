"""``spec.trainer.verl``: one override set per spec, moved onto verl 0.9.1 by the 0.9 line's adapter only where 0.9.1 differs.

Pure checks here (the default line's environment, verl 0.6.1); the 0.9 line's composition against
verl 0.9.1 is tests/verl09. The reward guard runs here on every 0.6 PPO stage, and fails when
the reward keys are missing: it is not vacuous on this line either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.recipe.render.command import hydra_overrides
from retool.recipe.verl_plugins import AGENT_LOOP_CONFIG, REWARD_FILE
from tests.render.cases import VARIANTS, context_of, run_of
from tests.render.verl_config import compose_verl
from tests.verl09.lines import BOTH_LINES_CASES as CASES
from tests.verl09.lines import BOTH_LINES_PPO_CASES as PPO_CASES
from tests.verl09.lines import rendered, run_on

IDS = [f"{variant}-{stage}" for variant, stage in CASES]
PPO_IDS = [f"{variant}-{stage}" for variant, stage in PPO_CASES]
ALL_STAGES = ("prepare", "preflight", "sft", "merge", "rl", "eval")

# What verl 0.9.1 names differently, read from verl's own files (the verl==0.6.1 and verl==0.9.1 wheels on PyPI,
# installed in .venv and .venv-verl09), written here so that the adapter (retool/recipe/render/v0_9.py) is
# checked against verl, not against itself.
SFT_RENAMED_IN_0_9_1: dict[str, str | None] = {
    # 0.6.1 verl/trainer/config/sft_trainer.yaml `model.partial_pretrain` -> 0.9.1 verl/trainer/config/model/hf_model.yaml
    # `path`, composed at `model` by sft_trainer_engine.yaml (`model@model: hf_model`)
    "model.partial_pretrain": "model.path",
    # 0.6.1 sft_trainer.yaml `model.strategy`, `model.fsdp_config.{cpu_offload,offload_params}` and the top-level
    # `ulysses_sequence_parallel_size` -> 0.9.1 verl/trainer/config/engine/fsdp.yaml `strategy`, `optimizer_offload`,
    # `param_offload`, `ulysses_sequence_parallel_size`, composed at `engine` (`engine@engine: fsdp`)
    "model.strategy": "engine.strategy",
    "model.fsdp_config.cpu_offload": "engine.optimizer_offload",
    "model.fsdp_config.offload_params": "engine.param_offload",
    "ulysses_sequence_parallel_size": "engine.ulysses_sequence_parallel_size",
    # 0.6.1 sft_trainer.yaml top-level `use_remove_padding` -> 0.9.1 model/hf_model.yaml `use_remove_padding`
    "use_remove_padding": "model.use_remove_padding",
    # 0.6.1 sft_trainer.yaml `data.multiturn.{enable,messages_key,tools_key}` -> 0.9.1 sft_trainer_engine.yaml
    # `data.messages_key`, `data.tools_key`; no `enable` (MultiTurnSFTDataset is the only dataset)
    "data.multiturn.messages_key": "data.messages_key",
    "data.multiturn.tools_key": "data.tools_key",
    "data.multiturn.enable": None,
}
PPO_RENAMED_IN_0_9_1: dict[str, str | None] = {
    # 0.9.1 verl/trainer/ppo/reward.py get_custom_reward_fn reads `config.reward.custom_reward_function`
    # (verl/trainer/config/reward/reward.yaml, composed at `reward` by ppo_trainer.yaml: `reward@reward: reward`)
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    # 0.6.1 verl/trainer/config/critic/dp_critic.yaml `../engine@model.fsdp_config: fsdp` -> 0.9.1 `../engine@fsdp: fsdp`
    "critic.model.fsdp_config.param_offload": "critic.fsdp.param_offload",
    "critic.model.fsdp_config.optimizer_offload": "critic.fsdp.optimizer_offload",
}
REWARD_KWARGS_0_6_1, REWARD_KWARGS_0_9_1 = "+custom_reward_function.reward_kwargs.", "+reward.custom_reward_function.reward_kwargs."
"""Where each line's ``get_custom_reward_fn`` reads ``reward_kwargs`` (verl/trainer/ppo/reward.py; not in the schema: ``+``)."""
AGENT_LOOP_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
"""The same key in both releases (verl/trainer/config/rollout/rollout.yaml); its value is the line's own agent loop."""
SFT_SET_ON_0_9_1 = {
    # docs/verl-lines.md, "SFT" and "The SFT dataset": verl 0.9.1's sft_trainer_engine.yaml defaults are
    # `data.use_dynamic_bsz: True` and `data.ignore_input_ids_mismatch: False`; `data.custom_cls` is ours
    "data.use_dynamic_bsz": False,
    "data.custom_cls.path": "pkg://retool.recipe.verl_plugins.v0_9.sft_dataset",
    "data.custom_cls.name": "RetoolSFTDataset",
    "data.ignore_input_ids_mismatch": True,
}
PPO_SET_ON_0_9_1 = {"trainer.use_v1": False}
"""verl 0.9.1's ppo_trainer.yaml has ``trainer.use_v1: true``; the line runs the legacy trainer (docs/verl-lines.md)."""
SFT_MODULE_0_6_1, SFT_MODULE_0_9_1 = "verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer"
"""verl 0.6.1's verl/trainer/fsdp_sft_trainer.py is gone in 0.9.1, whose verl/trainer/sft_trainer.py runs ``sft_trainer_engine``."""
PPO_MODULE_0_6_1, PPO_MODULE_0_9_1 = "retool.recipe.verl_plugins.main_ppo", "retool.recipe.verl_plugins.v0_9.main_ppo"
AGENT_LOOP_CONFIG_0_9_1 = "retool/recipe/verl_plugins/v0_9/agent_loops.yaml"


def test_the_default_line_is_0_6() -> None:
    assert run_of("minimal").spec.trainer.verl == "0.6.1"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_naming_line_0_6_renders_exactly_what_the_default_renders(variant: str) -> None:
    from retool.recipe.render.stages import enabled_stages, render_stage

    run = run_of(variant)
    for stage in enabled_stages(run):
        assert rendered(variant, stage, "0.6.1") == render_stage(run, stage, context_of(run)), stage


@pytest.mark.parametrize(("variant", "stage"), CASES, ids=IDS)
def test_line_0_9_keeps_every_recipe_value_and_moves_only_what_verl_0_9_1_renamed(variant: str, stage: str) -> None:
    old, new = rendered(variant, stage, "0.6.1"), rendered(variant, stage, "0.9.1")
    renamed = SFT_RENAMED_IN_0_9_1 if stage == "sft" else PPO_RENAMED_IN_0_9_1
    added = SFT_SET_ON_0_9_1 if stage == "sft" else PPO_SET_ON_0_9_1
    expected: dict[str, object] = {}
    for key, value in old.overrides.items():
        if key.startswith(REWARD_KWARGS_0_6_1):
            expected[REWARD_KWARGS_0_9_1 + key.removeprefix(REWARD_KWARGS_0_6_1)] = value
        elif key in renamed:
            if renamed[key] is not None:
                expected[renamed[key]] = value  # type: ignore[index]
        elif key == AGENT_LOOP_KEY:
            assert value == AGENT_LOOP_CONFIG
            assert new.overrides[key].endswith(AGENT_LOOP_CONFIG_0_9_1) and Path(new.overrides[key]).is_file()
            expected[key] = new.overrides[key]
        else:
            expected[key] = value  # the recipe's value, the same on both lines
    assert new.overrides == {**expected, **added}
    assert new.argv[-len(new.overrides) :] == hydra_overrides(new.overrides)
    assert (new.env, new.files, new.pre, new.notes) == (old.env, old.files, old.pre, old.notes)


@pytest.mark.parametrize(("variant", "stage"), CASES, ids=IDS)
def test_line_0_9_runs_verl_0_9_1s_programs(variant: str, stage: str) -> None:
    command = rendered(variant, stage, "0.9.1")
    if stage == "sft":
        assert SFT_MODULE_0_9_1 in command.argv and SFT_MODULE_0_6_1 not in command.argv
        assert command.config_name == "sft_trainer_engine"
    else:
        assert command.argv[:3] == ("python3", "-m", PPO_MODULE_0_9_1) and PPO_MODULE_0_6_1 not in command.argv
        assert command.overrides["reward.custom_reward_function.path"] == REWARD_FILE
        assert not any(key.lstrip("+").startswith("custom_reward_function.") for key in command.overrides), "0.9.1 ignores the top-level reward keys"
        assert command.overrides["trainer.use_v1"] is False


@pytest.mark.parametrize("stage", ["prepare", "preflight", "merge"])
def test_stages_outside_verls_hydra_programs_are_the_same_on_both_lines(stage: str) -> None:
    assert rendered("qwen32b-h200", stage, "0.9.1") == rendered("qwen32b-h200", stage, "0.6.1")


@pytest.mark.parametrize(("variant", "stage"), PPO_CASES, ids=PPO_IDS)
def test_the_reward_guard_passes_on_every_0_6_ppo_stage(variant: str, stage: str) -> None:
    command = rendered(variant, stage, "0.6.1")
    result = check_reward_guard(compose_verl("ppo_trainer", hydra_overrides(command.overrides)), stage, expected_reward_kwargs(command.overrides))
    assert result.status == "passed", result.summary
    expected = {"tool_turn_shaping": True} if stage == "rl" and run_on(variant, "0.6.1").spec.rl.tool_turn_shaping else {}
    assert result.details["reward_kwargs"] == expected


def test_the_reward_guard_fails_on_0_6_without_the_reward_keys() -> None:
    command = rendered("qwen32b-h200", "rl", "0.6.1")
    overrides = {k: v for k, v in command.overrides.items() if not k.startswith("custom_reward_function.")}
    result = check_reward_guard(compose_verl("ppo_trainer", hydra_overrides(overrides)), "rl", {})
    assert result.status == "failed" and result.details["called"] != "retool.recipe.reward.score.compute_score"


@pytest.mark.parametrize("line", ["0.6.1", "0.9.1"])
def test_the_line_is_a_param_of_the_runs_mlflow_runs(line: str) -> None:
    from retool.tracking.params import spec_params

    assert spec_params(run_on("minimal", line))["trainer.verl"] == line


@pytest.mark.parametrize(
    ("accelerator", "line", "image", "warned"),
    [("ascend", "0.9.1", None, True), ("ascend", "0.9.1", "example/ascend-verl09:dev", False), ("ascend", "0.6.1", None, False), ("nvidia", "0.9.1", None, False)],
    ids=["ascend-0.9-warns", "ascend-0.9-with-an-image", "ascend-0.6", "nvidia-0.9"],
)
def test_a_line_without_an_image_for_the_hardware_is_a_warning(accelerator: str, line: str, image: str | None, warned: bool) -> None:
    from retool.spec.validate import ASCEND_0_9_WARNING, document_warnings

    doc = VARIANTS["qwen7b-ascend"]()
    doc["spec"]["hardware"]["accelerator"] = accelerator
    doc["spec"]["hardware"].pop("product", None)
    if image:
        doc["spec"]["hardware"]["image"] = image
    doc["spec"]["trainer"] = {"verl": line}
    found = [str(p) for p in document_warnings(doc) if p.path == "spec.trainer.verl"]
    assert found == ([f"spec.trainer.verl: {ASCEND_0_9_WARNING}"] if warned else [])
