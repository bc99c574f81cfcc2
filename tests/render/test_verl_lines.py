"""``spec.trainer.verl``: one override set per spec, moved onto verl 0.9.1 by the 0.9 line's adapter only where 0.9.1 differs.

Pure checks here (the default line's environment, verl 0.6.1); the 0.9 line's composition against
verl 0.9.1 is tests/verl09. The reward guard runs here on every 0.6 PPO stage, and fails when
the reward keys are missing: it is not vacuous on this line either.
"""

from __future__ import annotations

import pytest

from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.recipe.render import v0_9 as line09
from retool.recipe.render.command import hydra_overrides
from retool.recipe.render.common import PPO_MODULE, SFT_MODULE
from retool.recipe.verl_plugins import AGENT_LOOP_CONFIG, REWARD_FILE, v0_9
from tests.render.cases import VARIANTS, context_of, run_of
from tests.render.verl_config import compose_verl
from tests.verl09.lines import BOTH_LINES_CASES as CASES
from tests.verl09.lines import BOTH_LINES_PPO_CASES as PPO_CASES
from tests.verl09.lines import rendered, run_on

IDS = [f"{variant}-{stage}" for variant, stage in CASES]
PPO_IDS = [f"{variant}-{stage}" for variant, stage in PPO_CASES]
ALL_STAGES = ("prepare", "preflight", "sft", "merge", "rl", "eval")


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
    renamed = line09.SFT_KEYS if stage == "sft" else line09.PPO_KEYS
    added = line09.SFT_ADDED if stage == "sft" else line09.PPO_ADDED
    for key, value in old.overrides.items():
        if key.startswith(line09.REWARD_KWARGS_06):
            assert new.overrides[line09.REWARD_KWARGS_09 + key.removeprefix(line09.REWARD_KWARGS_06)] == value
        elif key in renamed:
            assert key not in new.overrides
            if renamed[key] is not None:
                assert new.overrides[renamed[key]] == value, key
        elif key == line09.AGENT_LOOP_KEY:
            assert (value, new.overrides[key]) == (AGENT_LOOP_CONFIG, v0_9.AGENT_LOOP_CONFIG)
        else:
            assert new.overrides[key] == value, f"{key}: the recipe's value must be the same on both lines"
    for key, value in added.items():
        assert new.overrides[key] == value
    assert new.argv[-len(new.overrides) :] == hydra_overrides(new.overrides)
    assert (new.env, new.files, new.pre, new.notes) == (old.env, old.files, old.pre, old.notes)


@pytest.mark.parametrize(("variant", "stage"), CASES, ids=IDS)
def test_line_0_9_runs_verl_0_9_1s_programs(variant: str, stage: str) -> None:
    command = rendered(variant, stage, "0.9.1")
    if stage == "sft":
        assert v0_9.SFT_MODULE in command.argv and SFT_MODULE not in command.argv
        assert command.config_name == "sft_trainer_engine"
    else:
        assert command.argv[:3] == ("python3", "-m", v0_9.PPO_MAIN_MODULE) and PPO_MODULE not in command.argv
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
