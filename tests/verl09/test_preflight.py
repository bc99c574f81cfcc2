"""The preflight of a 0.9-line run, on verl 0.9.1: the ported checks pass on a prepared example, the rest
are reported as skipped (never silently passed), and the reward guard fails a run whose reward keys
are rendered the 0.6 way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from retool.preflight.checks import BY_NAME
from retool.preflight.entry import execute
from retool.preflight.line09 import NOT_PORTED, UNPORTED_CHECKS
from retool.preflight.plan import PreflightOptions, plan
from retool.recipe.render.command import hydra_overrides
from retool.spec.validate import parse_run
from tests.recipe_tool.scripted_server import Script, scripted_sandbox
from tests.verl09.test_compose import as_0_6_reward_keys

PORTED = ("tokenizer", "config", "reward-guard", "tools", "rl-data", "eval-data", "reward")


def target_on_0_9(prepared, sandbox_url: str):
    doc = yaml.safe_load(Path(prepared.spec_file).read_text())
    doc["spec"].setdefault("trainer", {})["verl"] = "0.9.1"
    run = parse_run(doc)
    return plan(run, prepared.context(sandbox_url))


@pytest.fixture(scope="module")
def sandbox_url():
    with scripted_sandbox(Script()) as url:
        yield url


@pytest.mark.parametrize("example", ["smoke-qwen0.5b", "qwen32b-h200-text-only"])
def test_a_prepared_example_preflights_on_the_0_9_line(example: str, prepare, qwen_model: str, sandbox_url: str, tmp_path: Path) -> None:
    target = target_on_0_9(prepare(example), sandbox_url)
    report = execute(target, PreflightOptions(tokenizer=qwen_model, work_dir=tmp_path))
    by_check: dict[str, set[str]] = {}
    for result in report.results:
        by_check.setdefault(result.check, set()).add(result.status)
    ported = PORTED if target.uses_tools else tuple(c for c in PORTED if c != "tools")  # text-only: no tool to build
    assert {check: by_check.get(check) for check in ported} == {check: {"passed"} for check in ported}, [r for r in report.results if r.status != "passed"]
    for check in UNPORTED_CHECKS:
        (result,) = [r for r in report.results if r.check == check]
        assert (result.status, result.summary) == ("skipped", NOT_PORTED)
    assert report.exit_code == 0 and report.facts["verl_line"] == "0.9.1"


def test_the_0_9_preflight_fails_a_run_whose_reward_keys_are_rendered_the_0_6_way(prepare, qwen_model: str, sandbox_url: str, tmp_path: Path) -> None:
    target = target_on_0_9(prepare("smoke-qwen0.5b"), sandbox_url)
    commands = dict(target.commands)
    for stage in ("rl", "eval"):
        overrides = as_0_6_reward_keys(dict(commands[stage].overrides))
        commands[stage] = dataclasses.replace(commands[stage], overrides=overrides, argv=(*commands[stage].argv[:3], *hydra_overrides(overrides)))
    report = execute(dataclasses.replace(target, commands=commands), PreflightOptions(tokenizer=qwen_model, work_dir=tmp_path))
    guards = [r for r in report.results if r.check == "reward-guard"]
    assert [r.status for r in guards] == ["failed", "failed"]
    assert "verl 0.9.1 would score with its default" in next(r for r in report.results if r.label == "reward[rl]").summary
    assert report.exit_code == BY_NAME["reward"].exit_code
    assert "also failed: reward-guard[rl], reward-guard[eval]" in (report.failure or "")
