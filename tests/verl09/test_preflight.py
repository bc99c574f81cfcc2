"""The preflight of a 0.9-line run, on verl 0.9.1: every check runs and passes on a prepared example
(the sandbox and the scripted rollouts against the real sandbox); each of sft-data, rollout and
trainer-batch fails on a bad input; the reward guard fails a run whose reward keys are rendered the 0.6 way."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from transformers import AutoTokenizer

from retool.data.schema import SFT_SCHEMA, code_interpreter_tool
from retool.preflight.checks import BY_NAME
from retool.preflight.entry import execute
from retool.preflight.episodes import conversation
from retool.preflight.line09 import engine_sft_dataset
from retool.preflight.plan import PreflightOptions, plan
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX
from retool.preflight.sft import check_sft, plain
from retool.recipe.render.command import hydra_overrides
from retool.spec.validate import parse_run
from tests.recipe_tool.scripted_server import Script, sandbox_answer, scripted_sandbox
from tests.render.verl_config import compose_verl
from tests.spec.test_model_fit import QWEN_0_5B, QWEN_32B
from tests.verl09.lines import rendered
from tests.verl09.test_compose import as_0_6_reward_keys

CHECKS = ("tokenizer", "model", "config", "sft-data", "reward-guard", "tools", "sandbox", "rl-data", "eval-data", "reward", "reward-watch", "rollout", "trainer-batch")
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


# ------------------------------------------------------------------------------ each ported check fails on a bad input


def with_overrides(target, stages: tuple[str, ...], changes: dict) -> object:
    """``target`` with only ``stages`` (fewer rollouts), each with ``changes`` over its rendered overrides."""
    commands = {}
    for stage in stages:
        command = target.commands[stage]
        overrides = {**command.overrides, **changes}
        commands[stage] = dataclasses.replace(command, overrides=overrides, argv=(*command.argv[:3], *hydra_overrides(overrides)))
    return dataclasses.replace(target, commands=commands)


def sft_file(path: Path, conversations: list[list[dict]]) -> str:
    rows = [{"messages": messages, "tools": [code_interpreter_tool()], "data_source": "preflight"} for messages in conversations]
    pq.write_table(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path)
    return str(path)


@pytest.mark.parametrize(
    ("defect", "status", "finding"),
    [
        (None, "warning", "per-turn renderings"),
        ("interpreter output in an assistant turn", "failed", "interpreter output would be trained on"),
        ("every trajectory longer than sft.maxLength", "failed", "longer than sft.maxLength"),
        ("a row whose question alone fills sft.maxLength", "failed", "trains on no token"),
    ],
)
def test_the_0_9_sft_data_check_runs_verls_sft_dataset_and_fails_a_bad_row(qwen_model: str, tmp_path: Path, defect: str | None, status: str, finding: str) -> None:
    """verl 0.9.1's SFT dataset (sft_trainer's create_sft_dataset on the rendered sft_trainer_engine config) under check_sft."""
    conversations = [plain(conversation(f"What is {i} + {i}?", str(2 * i))) for i in range(6)]
    if defect == "interpreter output in an assistant turn":
        conversations[3][1]["content"] += "\n<interpreter>\npreflight result: 6\n</interpreter>"
    if defect == "every trajectory longer than sft.maxLength":
        conversations = [[*c[:3], {**c[3], "content": c[3]["content"] + " " + "and so on " * 400}] for c in conversations]
    if defect == "a row whose question alone fills sft.maxLength":
        conversations[2][0]["content"] += " " + "and so on " * 400
    command = rendered("smoke-qwen0.5b", "sft")
    files = sft_file(tmp_path / "sft.parquet", conversations)
    config = compose_verl("sft_trainer_engine", hydra_overrides({**command.overrides, "data.train_files": files, "data.max_length": 1024}))
    result, dataset = check_sft(config, AutoTokenizer.from_pretrained(qwen_model), tool_format="hermes", sample=8, max_truncated_fraction=0.05, create_dataset=engine_sft_dataset)
    # The dataset the sft stage's verl builds: the rendered data.custom_cls, a subclass of verl 0.9.1's own.
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from retool.recipe.verl_plugins.v0_9.sft_dataset import RetoolSFTDataset

    assert type(dataset) is RetoolSFTDataset and isinstance(dataset, MultiTurnSFTDataset)
    assert (result.status, finding in result.summary) == (status, True), result


def failing_rollout_code(request: dict) -> str:
    """The sandbox runs the preflight's probe, and fails the code of every scripted rollout (its print of "preflight result")."""
    if "preflight" in request.get("code", ""):
        return sandbox_answer("", "Traceback (most recent call last):\nRuntimeError: the sandbox broke\n", return_code=1)
    return sandbox_answer("probe 42\n")


def test_the_0_9_rollout_check_fails_a_rollout_whose_tool_call_breaks(prepare, qwen_model: str, tmp_path: Path) -> None:
    prepared = prepare("smoke-qwen0.5b")
    script = Script(respond=failing_rollout_code)
    with scripted_sandbox(script) as url:
        target = with_overrides(target_on_0_9(prepared, url), ("rl",), {"trainer.test_freq": -1, "trainer.val_before_train": False})  # the training step's rollouts only
        model = staged_model(qwen_model, prepared.run.spec.model.base, tmp_path / "model")
        report = execute(target, PreflightOptions(tokenizer=model, work_dir=tmp_path / "work"))
    statuses = {r.label: r.status for r in report.results}
    assert statuses["sandbox[rl]"] == "passed", statuses
    (rollout,) = [r for r in report.results if r.check == "rollout"]
    assert rollout.status == "failed" and "never saw the sandbox's output" in rollout.summary and "the sandbox broke" in rollout.summary, rollout
    assert any("preflight" in r["code"] for r in script.requests), "the rollout's tool call reached the sandbox through verl 0.9.1's agent loop"
    assert statuses["trainer-batch[rl]"] == "skipped", statuses
    assert report.exit_code == BY_NAME["rollout"].exit_code


REPEATING_REWARD = """
from retool.recipe.reward.score import compute_score as retool_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # a result key that repeats a column of the trainer's batch, with another value
    return {**retool_score(data_source, solution_str, ground_truth, extra_info, **kwargs), "data_source": "scored-" + data_source}
"""


def test_the_0_9_trainer_batch_check_fails_a_batch_verls_trainer_cannot_assemble(prepare, qwen_model: str, real_sandbox: str, tmp_path: Path) -> None:
    reward = tmp_path / "repeating_reward.py"
    reward.write_text(REPEATING_REWARD)
    prepared = prepare("smoke-qwen0.5b")
    target = with_overrides(target_on_0_9(prepared, real_sandbox), ("rl",), {"reward.custom_reward_function.path": str(reward)})
    model = staged_model(qwen_model, prepared.run.spec.model.base, tmp_path / "model")
    report = execute(target, PreflightOptions(tokenizer=model, work_dir=tmp_path / "work"))
    statuses = {r.label: r.status for r in report.results}
    assert (statuses["reward[rl]"], statuses["rollout[rl]"]) == ("passed", "passed"), [(r.label, r.summary) for r in report.results if r.status != "passed"]
    (batch,) = [r for r in report.results if r.check == "trainer-batch"]
    assert batch.status == "failed" and "a reward result key repeats a column of the trainer's batch" in batch.summary, batch
    assert {p.split(":")[0] for p in batch.details["problems"]} == {"training step", "validation"}, batch.details
