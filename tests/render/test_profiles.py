"""Engine profiles: model size from the spec or the name, and the advice they give."""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.recipe.render.profiles import advice, engine_profile, model_size_billions, size_class
from retool.recipe.render.stages import render_stage
from retool.spec.model import RetoolRunSpec
from tests.render.cases import context_of, run_of


def spec(base: str = "Qwen/Qwen2.5-32B-Instruct", accelerator: str = "nvidia", size: float | None = None, **rl: object) -> RetoolRunSpec:
    return RetoolRunSpec.model_validate(
        {"model": {"base": base, "sizeBillions": size}, "hardware": {"accelerator": accelerator}, "storage": {"pvc": {"claimName": "c"}}, "rl": rl}
    )


@pytest.mark.parametrize(
    ("base", "size", "expected"),
    [
        pytest.param("Qwen/Qwen2.5-32B-Instruct", None, 32.0, id="size-in-hub-name"),
        pytest.param("Qwen/Qwen2.5-7B-Instruct", None, 7.0, id="version-number-is-not-the-size"),
        pytest.param("Qwen/Qwen2.5-1.5B", None, 1.5, id="fractional-size"),
        pytest.param("/models/my-sft-checkpoint", None, None, id="path-without-size"),
        pytest.param("/models/my-sft-checkpoint", 14.0, 14.0, id="size-from-spec"),
        pytest.param("Qwen/Qwen2.5-32B-Instruct", 7.0, 7.0, id="spec-wins-over-name"),
        pytest.param("s3://bucket/llama-3-70b", None, 70.0, id="lower-case-b-in-s3-uri"),
    ],
)
def test_model_size(base: str, size: float | None, expected: float | None) -> None:
    assert model_size_billions(spec(base, size=size)) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [(0.5, "small"), (3, "small"), (7, "medium"), (14, "medium"), (32, "large"), (72, "huge"), (None, "large")],
    ids=lambda v: str(v),
)
def test_size_class(size: float | None, expected: str) -> None:
    assert size_class(size) == expected


@pytest.mark.parametrize(
    ("base", "accelerator", "name"),
    [
        pytest.param("Qwen/Qwen2.5-32B-Instruct", "nvidia", "large-nvidia", id="paper-setting"),
        pytest.param("Qwen/Qwen2.5-7B-Instruct", "ascend", "medium-ascend", id="ascend-reference"),
        pytest.param("/models/unnamed", "nvidia", "large-nvidia", id="unknown-size-is-the-32b-default"),
    ],
)
def test_profile_choice(base: str, accelerator: str, name: str) -> None:
    assert engine_profile(spec(base, accelerator)).name == name


def test_reference_settings_get_no_advice() -> None:
    assert advice(run_of("qwen32b-h200").spec) == []
    assert advice(run_of("qwen7b-ascend").spec) == []


def test_departure_from_the_reference_is_advised_not_applied() -> None:
    s = spec("Qwen/Qwen2.5-7B-Instruct", "ascend")  # spec defaults are the 32B recipe: tp 4, sp 8
    notes = advice(s)
    assert any("rl.tensorParallel is 4" in n and "uses 2" in n for n in notes)
    assert any("rl.sequenceParallel is 8" in n and "uses 4" in n for n in notes)


def test_profile_sets_the_token_budgets() -> None:
    run = run_of("qwen32b-h200")
    overrides = render_stage(run, "rl", context_of(run)).overrides
    profile = engine_profile(run.spec)
    budget = (run.spec.rl.max_prompt_length + run.spec.rl.max_response_length) * profile.actor_token_factor
    assert overrides["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == budget
    assert overrides["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == budget * profile.log_prob_token_factor


RECIPE_MODULES = [
    pytest.param("data.custom_cls", "retool.recipe.verl_plugins.dataset", id="dataset-class"),
    pytest.param("custom_reward_function", "retool.recipe.reward.score", id="reward-function"),
]


@pytest.mark.parametrize(("section", "module"), RECIPE_MODULES)
def test_recipe_modules_named_in_the_command_exist(section: str, module: str) -> None:
    """The dataset class and the reward function the RL command names load through verl's own loader."""
    from verl.utils.import_utils import load_extern_type

    run = run_of("qwen32b-h200")
    overrides = render_stage(run, "rl", context_of(run)).overrides
    path, name = overrides[f"{section}.path"], overrides[f"{section}.name"]
    if not path.startswith("pkg://"):
        assert Path(path).is_file()
    assert load_extern_type(path, name) is not None
