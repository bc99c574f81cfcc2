"""How the preflight's checks are wired: what a skipped check blocks, which validation path a run
without an eval stage checks, and what the reward guard compares.

- A check whose dependency was skipped is skipped too, naming it (``State.blocked``): a skipped
  ``rl-data`` leaves no prompts, so ``reward`` and ``reward-watch`` must not run on them.
- The rl stage validates on the eval sets every ``testFreq`` steps; when the eval stage runs, its
  validation covers that path, and when it does not (``spec.eval.enabled: false``) the rl stage's own
  rollout check must run verl's ``_validate()`` on the eval sets.
- The reward guard fails when the reward kwargs verl binds to our reward (from the composed config)
  are not the ones the run renders, whichever way they differ.

Real components throughout: the Ascend example prepared from tiny local sources, Qwen's tokenizer,
verl 0.6.1's config composition, reward manager, agent loop and trainer, our sandbox.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import open_dict

from retool.preflight.checks import CheckResult
from retool.preflight.flow import State
from retool.preflight.plan import PreflightOptions, plan
from retool.preflight.report import Report
from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.preflight.runner import run_preflight
from retool.preflight.steps import config_checks
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from tests.preflight.conftest import PreparedRun

EXAMPLE = "qwen7b-ascend"


@pytest.fixture(scope="module")
def prepared(prepare: Callable[[str], PreparedRun]) -> PreparedRun:
    return prepare(EXAMPLE)


def run_with(prepared: PreparedRun, *, rl: dict[str, Any] | None = None, evaluation: dict[str, Any] | None = None) -> RetoolRun:
    document = yaml.safe_load(prepared.spec_file.read_text())
    document["spec"]["rl"].update(rl or {})
    document["spec"]["eval"].update(evaluation or {})
    return parse_run(document)


def result(report: Report, label: str) -> CheckResult:
    found = [r for r in report.results if r.label == label]
    assert len(found) == 1, [r.label for r in report.results]
    return found[0]


# ------------------------------------------------------------------------------ a skipped dependency


def test_a_skipped_dependency_blocks_the_check_that_needs_it() -> None:
    state = State()
    state.add(CheckResult("tokenizer", "run", "passed", "ok"))
    state.add(CheckResult("config", "rl", "passed", "ok"))
    state.add(CheckResult("config", "eval", "passed", "ok"))
    assert state.blocked("rl+eval", ["tokenizer", "config"]) is None
    state.skip("rl-data", "rl+eval", "needs something")
    assert state.blocked("rl", ["config", "rl-data"]) == "needs rl-data[rl+eval], which skipped"
    assert state.blocked("eval", ["tokenizer", "rl-data"]) == "needs rl-data[rl+eval], which skipped"
    state.add(CheckResult("tools", "rl", "failed", "no such class"))
    assert state.blocked("rl", ["tools"]) == "needs tools[rl], which failed"
    assert state.blocked("eval", ["tools"]) == "needs tools, which did not run"


@pytest.mark.slow
def test_checks_behind_a_skipped_check_are_skipped_not_run(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """A tokenizer without a chat template fails; ``rl-data`` is skipped for it, and what needs the
    RL data (``reward``, ``reward-watch``, the rollout) is skipped in turn, naming the skipped check."""
    tokenizer = Path(shutil.copytree(qwen_tokenizer, tmp_path / "tokenizer"))
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    full = plan(prepared.run, prepared.context(sandbox))
    target = replace(full, commands={"rl": full.commands["rl"]})
    report = run_preflight(target, PreflightOptions(tokenizer=str(tokenizer), work_dir=tmp_path / "work"))
    assert result(report, "tokenizer").status == "failed"
    assert (result(report, "rl-data[rl]").status, result(report, "rl-data[rl]").summary) == ("skipped", "needs tokenizer, which failed")
    for label in ("reward[rl]", "reward-watch[rl]"):
        assert (result(report, label).status, result(report, label).summary) == ("skipped", "needs rl-data[rl], which skipped"), label
    assert [result(report, label).status for label in ("rollout[rl]", "trainer-batch[rl]")] == ["skipped", "skipped"]
    assert report.exit_code == 11


# ------------------------------------------------------------------------------ validation without an eval stage


@pytest.mark.slow
def test_a_run_without_an_eval_stage_checks_the_rl_stages_validation(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """``spec.eval.enabled: false``: nothing else validates on the eval sets, so the rl stage's check
    runs verl's ``_validate()`` after its training step, and scores every eval set."""
    samples = 2
    run = run_with(prepared, rl={"rolloutN": 4}, evaluation={"enabled": False, "samplesPerProblem": samples})
    full = plan(run, prepared.context(sandbox))
    assert "eval" not in full.commands and run.spec.rl.test_freq > 0
    report = run_preflight(replace(full, commands={"rl": full.commands["rl"]}), PreflightOptions(tokenizer=qwen_tokenizer, work_dir=tmp_path))
    assert result(report, "eval-data[rl]").status == "passed", result(report, "eval-data[rl]").summary
    batch = result(report, "trainer-batch[rl]")
    assert batch.status == "passed", batch.summary
    assert batch.details["flows"] == ["training step", "validation"]
    eval_sets = [e.name for e in run.spec.data.eval]
    assert {f"val-core/{name}/acc/mean@{samples}": 1.0 for name in eval_sets}.items() <= batch.details["validation_metrics"].items()
    rollout = result(report, "rollout[rl]")
    assert rollout.status == "passed" and rollout.details["flows"] == ["training step", "validation"], rollout.summary
    assert f"of math_dapo, {', '.join(eval_sets)} called the sandbox" in rollout.summary


# ------------------------------------------------------------------------------ the reward guard's kwargs


@pytest.fixture(scope="module")
def shaped_rl(prepared: PreparedRun, qwen_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    """The rl stage of a run with ``toolTurnShaping``, composed as the preflight composes it, and the kwargs it renders."""
    full = plan(run_with(prepared, rl={"toolTurnShaping": True}), prepared.context("http://127.0.0.1:9"))
    target = replace(full, commands={"rl": full.commands["rl"]})
    state = State()
    config_checks(state, target, PreflightOptions(tokenizer=qwen_tokenizer, work_dir=tmp_path_factory.mktemp("guard-work")))
    assert [r.status for r in state.results] == ["passed"], state.results
    return state.configs["rl"], expected_reward_kwargs(target.commands["rl"].overrides)


def binding(config: Any, kwargs: dict[str, Any] | None) -> Any:
    """The composed config with ``custom_reward_function.reward_kwargs`` (what verl binds) replaced, or removed."""
    config = copy.deepcopy(config)
    with open_dict(config):
        if kwargs is None:
            config.custom_reward_function.pop("reward_kwargs")
        else:
            config.custom_reward_function.reward_kwargs = kwargs
    return config


@pytest.mark.slow
def test_the_reward_guard_passes_when_verl_binds_what_the_run_renders(shaped_rl: tuple[Any, dict[str, Any]]) -> None:
    config, rendered = shaped_rl
    assert rendered == {"tool_turn_shaping": True}
    guard = check_reward_guard(config, "rl", rendered)
    assert guard.status == "passed", guard.summary
    assert guard.details["reward_kwargs"] == rendered


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bound", "rendered"),
    [
        pytest.param({"tool_turn_shaping": False}, None, id="verl binds another value"),
        pytest.param(None, None, id="verl binds nothing the run renders"),
        pytest.param({"tool_turn_shaping": True, "format_score": 0.5}, None, id="verl binds one more kwarg"),
        pytest.param({"tool_turn_shaping": True}, {}, id="the run renders none of what verl binds"),
    ],
)
def test_the_reward_guard_fails_when_verl_binds_other_reward_kwargs_than_the_run_renders(
    shaped_rl: tuple[Any, dict[str, Any]], bound: dict[str, Any] | None, rendered: dict[str, Any] | None
) -> None:
    config, renders = shaped_rl
    renders = renders if rendered is None else rendered
    guard = check_reward_guard(binding(config, bound), "rl", renders)
    assert guard.status == "failed", guard.summary
    assert guard.details["called"] == "retool.recipe.reward.score.compute_score", "our reward, with other kwargs"
    assert guard.summary == f"verl binds reward_kwargs {bound or {}} to our reward, the run renders {renders}"
