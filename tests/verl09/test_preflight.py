"""The preflight of a 0.9-line run, on verl 0.9.1: the ported checks pass on a prepared example (the
sandbox check against the real sandbox), the rest are reported as skipped (never silently passed), and
the reward guard fails a run whose reward keys are rendered the 0.6 way."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from retool.preflight.checks import BY_NAME
from retool.preflight.entry import execute
from retool.preflight.line09 import NOT_PORTED, UNPORTED_CHECKS
from retool.preflight.plan import PreflightOptions, plan
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX
from retool.recipe.render.command import hydra_overrides
from retool.spec.validate import parse_run
from tests.spec.test_model_fit import QWEN_0_5B, QWEN_32B
from tests.verl09.test_compose import as_0_6_reward_keys

PORTED = ("tokenizer", "model", "config", "reward-guard", "tools", "sandbox", "rl-data", "eval-data", "reward")
MODEL_CONFIGS = {"Qwen/Qwen2.5-0.5B-Instruct": QWEN_0_5B, "Qwen/Qwen2.5-32B-Instruct": QWEN_32B}


def staged_model(tokenizer: str, base: str, directory: Path) -> str:
    """What the prepare stage stages for the preflight: the tokenizer files and the base model's config.json."""
    shutil.copytree(tokenizer, directory, dirs_exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIGS[base]))
    return str(directory)


def target_on_0_9(prepared, sandbox_url: str):
    doc = yaml.safe_load(Path(prepared.spec_file).read_text())
    doc["spec"].setdefault("trainer", {})["verl"] = "0.9.1"
    run = parse_run(doc)
    return plan(run, prepared.context(sandbox_url))


@pytest.fixture(scope="module")
def real_sandbox(tmp_path_factory: pytest.TempPathFactory):
    """The real sandbox server, as the 0.6 preflight's example tests use it."""
    from retool.embedded.servers import sandbox_server

    with sandbox_server(tmp_path_factory.mktemp("sandbox"), workers=2) as server:
        yield server.base_url


@pytest.mark.parametrize("example", ["smoke-qwen0.5b", "qwen32b-h200-text-only"])
def test_a_prepared_example_preflights_on_the_0_9_line(example: str, prepare, qwen_model: str, real_sandbox: str, tmp_path: Path) -> None:
    prepared = prepare(example)
    target = target_on_0_9(prepared, real_sandbox)
    model = staged_model(qwen_model, prepared.run.spec.model.base, tmp_path / "model")
    report = execute(target, PreflightOptions(tokenizer=model, work_dir=tmp_path / "work"))
    by_check: dict[str, set[str]] = {}
    for result in report.results:
        by_check.setdefault(result.check, set()).add(result.status)
    ported = PORTED if target.uses_tools else tuple(c for c in PORTED if c not in ("tools", "sandbox"))  # text-only: no tool, no sandbox
    assert {check: by_check.get(check) for check in ported} == {check: {"passed"} for check in ported}, [r for r in report.results if r.status != "passed"]
    if target.uses_tools:
        assert all("ran code in" in r.summary for r in report.results if r.check == "sandbox"), [r for r in report.results if r.check == "sandbox"]
    else:
        assert {r.summary for r in report.results if r.check == "sandbox"} == {TEXT_ONLY_SANDBOX}
    for check in UNPORTED_CHECKS:
        (result,) = [r for r in report.results if r.check == check]
        assert (result.status, result.summary) == ("skipped", NOT_PORTED)
    assert report.exit_code == 0 and report.facts["verl_line"] == "0.9.1"


def test_the_0_9_preflight_fails_a_run_whose_reward_keys_are_rendered_the_0_6_way(prepare, qwen_model: str, real_sandbox: str, tmp_path: Path) -> None:
    target = target_on_0_9(prepare("smoke-qwen0.5b"), real_sandbox)
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
