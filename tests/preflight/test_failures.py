"""The preflight catches real breakage, with the check that failed, a precise reason and its exit code.

Each case breaks one thing the way it breaks in practice (a reward that echoes a batch column, a
stale tool class path, a sandbox that is not there, unconverted SFT data, prompts longer than the
limit, a template whose tool calls the rollout cannot parse ...) on the Ascend example's prepared
data, and checks only the stages the case needs, so the rest of the run stays fast.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from retool.data.schema import SFT_SCHEMA, code_interpreter_tool
from retool.preflight.checks import BY_NAME, PERMANENT_EXIT_CODES
from retool.preflight.plan import Plan, PreflightOptions, plan
from retool.preflight.report import Report
from retool.preflight.runner import run_preflight
from retool.preflight.steps import TEXT_ONLY_SANDBOX, TEXT_ONLY_TOOLS
from retool.recipe.render.command import StageCommand
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from tests.conftest import free_port
from tests.data.helpers import RETOOL_TEXT
from tests.preflight.conftest import PreparedRun

pytestmark = pytest.mark.slow

EXAMPLE = "qwen7b-ascend"


@pytest.fixture(scope="module")
def prepared(prepare: Callable[[str], PreparedRun]) -> PreparedRun:
    return prepare(EXAMPLE)


def only(target: Plan, *stages: str, **changed: StageCommand) -> Plan:
    commands = {stage: changed.get(stage, target.commands[stage]) for stage in stages}
    return replace(target, commands=commands)


def overridden(command: StageCommand, **values: Any) -> StageCommand:
    return replace(command, overrides={**command.overrides, **{key.replace("__", "."): value for key, value in values.items()}})


def preflight(target: Plan, tokenizer: str, work_dir: Path, **options: Any) -> Report:
    return run_preflight(target, PreflightOptions(tokenizer=tokenizer, work_dir=work_dir, **options))


def outcome(report: Report) -> dict[str, str]:
    return {result.label: result.status for result in report.results}


def failed(report: Report, label: str) -> str:
    result = next(r for r in report.results if r.label == label)
    assert result.status == "failed", f"{label} is {result.status}: {result.summary}"
    return result.summary


def assert_exit(report: Report, check: str) -> None:
    assert report.exit_code == BY_NAME[check].exit_code
    assert report.failure is not None and report.failure.startswith(f"preflight check {check}")


REWARDS = {
    "a result key repeating the batch's data_source": (
        'return {**result, "data_source": data_source}',
        "result key 'data_source' repeats the batch column 'data_source'",
        "AssertionError: `data_source` in tensor_dict1 and tensor_dict2 are not the same object",
    ),
    "a boolean acc": (
        'return {**result, "acc": bool(result["acc"])}',
        "result key(s) acc hold booleans",
        "TypeError: Object of type bool_ is not JSON serializable",
    ),
}


def eval_with_reward(prepared: PreparedRun, sandbox: str, tmp_path: Path, body: str) -> Plan:
    """The eval stage alone, scored by our reward with ``body`` applied to its result."""
    reward = tmp_path / "reward.py"
    reward.write_text(
        textwrap.dedent(
            f"""
            from retool.recipe.reward.score import compute_score as retool_score

            def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
                result = retool_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
                {body}
            """
        )
    )
    full = plan(spec_with(prepared), prepared.context(sandbox))
    return only(full, "eval", eval=overridden(full.commands["eval"], custom_reward_function__path=str(reward)))


@pytest.mark.parametrize(("body", "reward_problem", "trainer_error"), list(REWARDS.values()), ids=list(REWARDS))
def test_a_reward_whose_results_break_the_trainer_batch(
    prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path, body: str, reward_problem: str, trainer_error: str
) -> None:
    """The shapes of reward results verl 0.6.1 cannot take: the reward check names the key, and the
    rollout joined to the trainer's batch shows the error the eval stage would die of."""
    report = preflight(eval_with_reward(prepared, sandbox, tmp_path, body), qwen_tokenizer, tmp_path / "work")
    assert reward_problem in failed(report, "reward[eval]")
    assert outcome(report)["rollout[eval]"] == "passed"
    assert trainer_error in failed(report, "trainer-batch[eval]")
    assert_exit(report, "reward")


def test_a_tool_config_naming_a_class_that_does_not_exist(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    full = plan(prepared.run, prepared.context(sandbox))
    command = full.commands["eval"]
    files = {path: content.replace("retool.recipe.verl_plugins.tool.", "retool.recipe.tool_plugins.tool.") for path, content in command.files.items()}
    report = preflight(only(full, "eval", eval=replace(command, files=files)), qwen_tokenizer, tmp_path)
    assert "No module named 'retool.recipe.tool_plugins'" in failed(report, "tools[eval]")
    assert [outcome(report)[label] for label in ("sandbox[eval]", "rollout[eval]", "trainer-batch[eval]")] == ["skipped"] * 3
    assert_exit(report, "tools")


def test_a_sandbox_that_does_not_answer(prepared: PreparedRun, qwen_tokenizer: str, tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    report = preflight(only(plan(prepared.run, prepared.context(nowhere)), "eval"), qwen_tokenizer, tmp_path, sandbox_wait_s=1.0)
    assert f"the sandbox at {nowhere} did not answer /v1/ping within 1 s" in failed(report, "sandbox[eval]")
    assert outcome(report)["tools[eval]"] == "passed" and outcome(report)["rollout[eval]"] == "skipped"
    assert_exit(report, "sandbox")


def unconverted_sft(path: Path) -> Path:
    """ReTool-SFT trajectories left as one assistant text: the interpreter's output inside the assistant turn."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is twice the sum of 0..9? ({i})", "tool_calls": None},
                {"role": "assistant", "content": RETOOL_TEXT, "tool_calls": None},
            ],
            "tools": [code_interpreter_tool()],
            "data_source": "retool_sft",
        }
        for i in range(8)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path)
    return path


def test_sft_data_whose_interpreter_output_would_be_trained_on(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    full = plan(prepared.run, prepared.context(sandbox))
    sft = overridden(full.commands["sft"], data__train_files=str(unconverted_sft(tmp_path / "sft.parquet")))
    report = preflight(only(full, "sft", sft=sft), qwen_tokenizer, tmp_path / "work")
    assert "contains '<interpreter>': interpreter output would be trained on" in failed(report, "sft-data[sft]")
    assert_exit(report, "sft-data")


def spec_with(prepared: PreparedRun, *, rl: dict[str, Any] | None = None, n: int = 4) -> Any:
    """The example's run with ``rl`` changes, validating ``n`` samples per problem (the failures
    here do not depend on n; fewer scripted rollouts keep the cases quick)."""
    document = yaml.safe_load(prepared.spec_file.read_text())
    document["spec"]["rl"].update(rl or {})
    document["spec"]["eval"]["samplesPerProblem"] = n
    return parse_run(document)


@pytest.mark.parametrize(
    ("rl", "rl_problem", "eval_problem"),
    [
        ({"maxPromptLength": 64}, "kept 0 of 600 prompts: 600 longer than max_prompt_length=64 tokens (with the tool schema)", "kept 0 of 4 prompts"),
        ({"batchSize": 1024, "miniBatchSize": 64}, "600 prompts left after filtering, fewer than one batch (spec.rl.batchSize: 1024)", None),
    ],
    ids=["every prompt longer than maxPromptLength", "fewer prompts than one batch"],
)
def test_prompts_the_trainer_cannot_use(
    prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path, rl: dict[str, Any], rl_problem: str, eval_problem: str | None
) -> None:
    run = spec_with(prepared, rl=rl)
    report = preflight(only(plan(run, prepared.context(sandbox)), "eval"), qwen_tokenizer, tmp_path)
    assert rl_problem in failed(report, "rl-data[eval]")
    if eval_problem:
        assert eval_problem in failed(report, "eval-data[eval]")
    assert outcome(report)["rollout[eval]"] == "skipped"
    assert_exit(report, "rl-data")


def tokenizer_copy(source: str, target: Path, edit: Callable[[dict[str, Any]], None]) -> str:
    shutil.copytree(source, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    edit(config)
    config_path.write_text(json.dumps(config))
    return str(target)


def test_a_tokenizer_without_a_chat_template(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    tokenizer = tokenizer_copy(qwen_tokenizer, tmp_path / "tokenizer", lambda c: c.pop("chat_template"))
    report = preflight(only(plan(prepared.run, prepared.context(sandbox)), "eval"), tokenizer, tmp_path / "work")
    assert failed(report, "tokenizer") == f"the tokenizer at {tokenizer} has no chat template"
    assert outcome(report)["rl-data[eval]"] == "skipped"
    assert_exit(report, "tokenizer")


def test_a_template_whose_tool_calls_the_rollout_cannot_parse(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """A model family that writes tool calls in another format than the rollout's parser
    (multi_turn.format=hermes) reads: SFT would teach calls that RL never executes."""

    def other_format(config: dict[str, Any]) -> None:
        config["chat_template"] = config["chat_template"].replace("<tool_call>", "<function_call>").replace("</tool_call>", "</function_call>")

    tokenizer = tokenizer_copy(qwen_tokenizer, tmp_path / "tokenizer", other_format)
    report = preflight(only(plan(spec_with(prepared), prepared.context(sandbox)), "sft", "eval"), tokenizer, tmp_path / "work")
    assert "the rollout's tool parser reads [] from the trained tokens" in failed(report, "sft-data[sft]")
    assert "stopped after the tool call" in " ".join(next(r for r in report.results if r.label == "rollout[eval]").details["problems"])
    assert_exit(report, "sft-data")


def test_an_override_verl_does_not_know(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    full = plan(prepared.run, prepared.context(sandbox))
    report = preflight(only(full, "eval", eval=overridden(full.commands["eval"], actor_rollout_ref__rollout__multi_turn__max_turns=8)), qwen_tokenizer, tmp_path)
    assert "Could not override 'actor_rollout_ref.rollout.multi_turn.max_turns'" in failed(report, "config[eval]")
    assert_exit(report, "config")


TEXT_ONLY = "qwen32b-h200-text-only"


@pytest.mark.parametrize(
    ("run_example", "data_example", "found", "expected"),
    [(TEXT_ONLY, EXAMPLE, "tool_agent", "single_turn_agent"), (EXAMPLE, TEXT_ONLY, "single_turn_agent", "tool_agent")],
    ids=["a text-only run on data prepared for the tool agent", "a tool run on data prepared for the text-only baseline"],
)
def test_data_prepared_for_the_other_recipe(
    prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, sandbox: str, tmp_path: Path, run_example: str, data_example: str, found: str, expected: str
) -> None:
    """The rows load either way and would train the wrong loop (tool prompts without a tool, or a
    ReTool run whose rollouts never see the interpreter): the agent each file names must be the recipe's."""
    target, source = prepare(run_example), prepare(data_example)
    paths = run_paths(source.run)
    train, val = paths.rl_train, [paths.eval_set(e.name) for e in source.run.spec.data.eval]
    full = plan(spec_with(target), target.context(sandbox))
    report = preflight(only(full, "eval", eval=overridden(full.commands["eval"], data__train_files=train, data__val_files=val)), qwen_tokenizer, tmp_path)
    recipe = target.run.spec.recipe
    rl_rows = pq.read_metadata(train).num_rows
    assert failed(report, "rl-data[eval]") == (
        f"{train} was prepared for another recipe: its rows name the agent loop {found!r} ({rl_rows} of {rl_rows} rows), "
        f"but recipe {recipe} runs {expected!r} (prepare the data again for this run: retool data prepare all --spec RUN.yaml)"
    )
    assert failed(report, "eval-data[eval]").startswith(f"{val[0]} was prepared for another recipe: its rows name the agent loop {found!r}")
    assert [outcome(report)[label] for label in ("reward[eval]", "rollout[eval]", "trainer-batch[eval]")] == ["skipped"] * 3
    assert_exit(report, "rl-data")
    assert report.exit_code in PERMANENT_EXIT_CODES


def test_a_text_only_run_skips_the_tool_and_sandbox_checks_with_the_reason(prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, tmp_path: Path) -> None:
    """No sandbox exists for the text-only baseline (the operator creates none and gives the stage no
    URL): the report says why its tool and sandbox were not checked, and the rollouts need neither."""
    prepared = prepare(TEXT_ONLY)
    report = preflight(only(plan(spec_with(prepared), prepared.context("")), "eval"), qwen_tokenizer, tmp_path)
    skipped = {r.label: r.summary for r in report.results if r.status == "skipped"}
    no_config = f"no config.json at {qwen_tokenizer}: the model's context window, heads and memory were not checked"
    assert skipped == {"tools[eval]": TEXT_ONLY_TOOLS, "sandbox[eval]": TEXT_ONLY_SANDBOX, "model": no_config}
    assert outcome(report)["rollout[eval]"] == outcome(report)["trainer-batch[eval]"] == "passed"
    assert report.exit_code == 0 and report.sandbox_url is None


def test_a_text_only_run_whose_prompts_offer_the_tool(prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, tmp_path: Path) -> None:
    """A chat template that always renders the tool (as if the rows still carried the schema) puts
    the code interpreter into a text-only run's prompts: the single-turn rollout shows it."""
    prepared = prepare(TEXT_ONLY)

    def tool_always(config: dict[str, Any]) -> None:
        config["chat_template"] = "{%- set tools = tools or [" + json.dumps(code_interpreter_tool()) + "] %}" + config["chat_template"]

    tokenizer = tokenizer_copy(qwen_tokenizer, tmp_path / "tokenizer", tool_always)
    report = preflight(only(plan(spec_with(prepared), prepared.context("")), "eval"), tokenizer, tmp_path / "work")
    assert "the prompt offers the code_interpreter tool: a text-only run's prompts carry no tool schema" in failed(report, "rollout[eval]")
    assert_exit(report, "rollout")


QWEN_7B_CONFIG = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                  "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip


def test_a_run_that_does_not_fit_the_model_fails_with_the_spec_fields_and_numbers(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """The staged model directory (tokenizer + config.json) of Qwen2.5-7B against a run asking for
    tensorParallel 8 and 1024 + 40000 tokens: vLLM would refuse both, hours later, on the devices."""
    model = Path(shutil.copytree(qwen_tokenizer, tmp_path / "model"))
    (model / "config.json").write_text(json.dumps(QWEN_7B_CONFIG))
    run = spec_with(prepared, rl={"tensorParallel": 8, "sequenceParallel": 4, "maxPromptLength": 1024, "maxResponseLength": 40000})
    report = preflight(only(plan(run, prepared.context(sandbox)), "eval"), str(model), tmp_path / "work")
    summary = failed(report, "model")
    assert "spec.rl.maxResponseLength: maxPromptLength + maxResponseLength = 1024 + 40000 = 41024 tokens exceeds the model's context window of 32768" in summary
    assert "spec.rl.tensorParallel: 8 does not split the model's 28 attention heads" in summary
    assert_exit(report, "model")
    assert BY_NAME["model"].exit_code in PERMANENT_EXIT_CODES
    assert outcome(report)["tokenizer"] == "passed"


@pytest.mark.parametrize(
    ("rl", "reason"),
    [
        pytest.param(
            {"maxTurns": 1},
            "spec.rl.maxTurns: 1 ends every episode after the model's first turn, so the tool's output never reaches the model; a tool-integrated run needs at least 2",
            id="maxTurns 1 is named as the limit",
        ),
        pytest.param(
            {"maxResponseLength": 64},
            "spec.rl.maxResponseLength: 64 tokens leave 6 after the first turn (58 tokens of reasoning and code)",
            id="maxResponseLength 64 is named as the limit, with the tokens the first turn used",
        ),
    ],
)
def test_a_limit_that_ends_the_episode_after_the_tool_call_is_named(
    prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path, rl: dict[str, Any], reason: str
) -> None:
    report = preflight(only(plan(spec_with(prepared, rl=rl), prepared.context(sandbox)), "eval"), qwen_tokenizer, tmp_path)
    problems = " ".join(next(r for r in report.results if r.label == "rollout[eval]").details["problems"])
    assert reason in problems, problems
    assert "or a limit ended the episode" not in problems


def test_rl_rows_without_reward_model_are_a_data_finding_not_a_crash(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """The issue's case: RL rows without ``reward_model`` used to raise KeyError in ``first_prompts`` (exit 1, a traceback)."""
    full = plan(spec_with(prepared), prepared.context(sandbox))
    source = pq.read_table(full.commands["rl"].overrides["data.train_files"])
    path = tmp_path / "train.parquet"
    pq.write_table(source.drop_columns(["reward_model"]), path)
    report = preflight(only(full, "rl", rl=overridden(full.commands["rl"], data__train_files=str(path))), qwen_tokenizer, tmp_path / "work")
    assert f"{path} row 0: field reward_model is missing" in failed(report, "rl-data[rl]")
    assert_exit(report, "rl-data")
    assert "Traceback" not in (report.failure or "")


def test_a_preflight_leaves_no_data_loader_worker_and_no_reward_module_behind(prepared: PreparedRun, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:
    """The preflight leaves its process as it found it, even when the checked run is broken.

    verl's validation starts ``data.dataloader_num_workers`` loader processes; torchdata's loader stops
    them only when an iteration ends. When the validation fails within its loop (here: a reward result
    that breaks the trainer's batch union) the loader keeps them with its last iterator, the error's
    traceback holds the trainer in a reference cycle, and the garbage collector, tearing the queues down
    first, later waits 5 s for each worker (40 s) in the middle of another check. And verl keeps the
    reward file it loaded as the module ``custom_module`` for any later path: a trainer built next in the
    same process would score with this broken reward."""
    import multiprocessing
    import sys

    before = {p.pid for p in multiprocessing.active_children()}
    report = preflight(eval_with_reward(prepared, sandbox, tmp_path, REWARDS["a result key repeating the batch's data_source"][0]), qwen_tokenizer, tmp_path / "work")
    assert outcome(report)["trainer-batch[eval]"] == "failed", report.results
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not left, f"{len(left)} processes the preflight started are still running: {left}"
    assert "custom_module" not in sys.modules, sys.modules["custom_module"]
