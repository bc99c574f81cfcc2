"""The preflight of a 0.9-line run, on verl 0.9.1: every check runs and passes on a prepared example
(the sandbox and the scripted rollouts against the real sandbox); each of sft-data, rollout and
trainer-batch fails on a bad input; the reward guard fails a run whose reward keys are rendered the 0.6 way."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from retool.preflight.checks import BY_NAME
from retool.preflight.entry import execute
from retool.preflight.plan import PreflightOptions, plan
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX
from retool.recipe.render.command import hydra_overrides
from retool.spec.validate import parse_run
from tests.spec.test_model_fit import QWEN_0_5B, QWEN_32B
from tests.verl09.test_compose import as_0_6_reward_keys

CHECKS = ("tokenizer", "model", "config", "sft-data", "reward-guard", "tools", "sandbox", "rl-data", "eval-data", "reward", "rollout", "trainer-batch")
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
"""What every Qwen2.5 ``config.json`` carries beside its shape: verl 0.9.1's ``AgentLoopWorker`` loads it (``HFModelConfig``)."""
MODEL_CONFIGS = {"Qwen/Qwen2.5-0.5B-Instruct": {**QWEN2, **QWEN_0_5B}, "Qwen/Qwen2.5-32B-Instruct": {**QWEN2, **QWEN_32B}}


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
    expected = CHECKS if target.uses_tools else tuple(c for c in CHECKS if c not in ("tools", "sandbox"))  # text-only: no tool, no sandbox
    if "sft" not in target.commands:
        expected = tuple(c for c in expected if c != "sft-data")
    # sft-data warns, as on verl 0.6.1 (tests/preflight/test_examples.py): Qwen3's template renders a turn alone differently.
    wanted = {check: {"warning"} if check == "sft-data" else {"passed"} for check in expected}
    assert {check: by_check.get(check) for check in expected} == wanted, [(r.label, r.status, r.summary) for r in report.results if r.status != "passed"]
    if "sft-data" in expected:
        (sft,) = [r for r in report.results if r.check == "sft-data"]
        assert sft.details["per_turn_rendering_differs"] > 0 and sft.details["over_max_length"] == 0
    for result in report.results:
        if result.check == "rollout":
            assert result.details["samples"] > 0 and result.details["tool_calls"] == (result.details["requests"] if target.uses_tools else 0), result
        if result.check == "trainer-batch":
            assert "verl 0.9.1's RayPPOTrainer" in result.summary, result
    if target.uses_tools:
        assert all("ran code in" in r.summary for r in report.results if r.check == "sandbox"), [r for r in report.results if r.check == "sandbox"]
    else:
        assert {r.summary for r in report.results if r.check == "sandbox"} == {TEXT_ONLY_SANDBOX}
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
