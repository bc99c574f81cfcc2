"""Bad data is a finding, never a crash: every required field of every data kind, missing, null or mistyped.

For SFT, RL and eval files, each required field is broken three ways (absent from the file, null
in one row, a value of the wrong type) and the data check runs on the stage's composed config
(``check_sft`` / ``check_rl_data`` / ``check_eval_data``): it fails with its documented exit code
(12 / 13 / 14), naming the file, the row and the field, and no exception escapes. One case goes
through the whole preflight: an RL row without ``reward_model`` (once a ``KeyError`` and exit 1).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import open_dict

from retool.data.schema import TOOL_NAME, code_interpreter_tool, rl_row
from retool.preflight.checks import BY_NAME, exit_code
from retool.preflight.data import check_eval_data, check_rl_data
from retool.preflight.fields import BATCH_ROWS, file_problems
from retool.preflight.plan import PreflightOptions, plan
from retool.preflight.sft import check_sft
from retool.preflight.steps import State, config_checks
from tests.preflight.conftest import PreparedRun

pytestmark = pytest.mark.slow

ROWS = 4
NULL_ROW = 2
ALL = "*"
"""In a path: every element of the list (a field absent from the file is absent from every row)."""


def rl_rows() -> list[dict[str, Any]]:
    return [rl_row(data_source="fields", question=f"What is {i} + 1?", ground_truth=str(i + 1), index=i, split="train", source_id=None) for i in range(ROWS)]


def call() -> dict[str, Any]:
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": "print(1 + 1)"}}}


def sft_rows() -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} + 1?", "tool_calls": None},
                {"role": "assistant", "content": "Let me compute it.", "tool_calls": [call()]},
                {"role": "tool", "content": "2", "tool_calls": None},
                {"role": "assistant", "content": "So \\boxed{2}.", "tool_calls": None},
            ],
            "tools": [code_interpreter_tool()],
            "data_source": "fields",
        }
        for i in range(ROWS)
    ]


def targets(node: Any, path: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    """(container, key) pairs the path's last step names (``ALL`` fans out over a list; None parents skipped)."""
    if len(path) == 1:
        keys = range(len(node)) if path[0] == ALL else [path[0]]
        return [(node, k) for k in keys]
    step, rest = path[0], path[1:]
    children = node if step == ALL else [node[step]]
    return [t for child in children if child is not None for t in targets(child, rest)]


def broken(rows: list[dict[str, Any]], path: tuple[Any, ...], defect: str, wrong: Any, first: dict[int, int]) -> list[dict[str, Any]]:
    """The rows with the field null in one row (at the first element it occurs in), or absent / of the wrong type everywhere."""
    rows = copy.deepcopy(rows)
    if defect == "null":
        for container, key in targets(rows[NULL_ROW], tuple(first.get(p, 0) if step == ALL else step for p, step in enumerate(path))):
            container[key] = None
        return rows
    for row in rows:
        for container, key in targets(row, path):
            if defect == "missing":
                del container[key]
            else:
                container[key] = wrong
    return rows


def field_name(path: tuple[Any, ...], first: dict[int, int]) -> str:
    """``prompt[0].content`` for a path, each ``ALL`` read as the index given for its position (default 0)."""
    name = ""
    for position, step in enumerate(path):
        if step == ALL or isinstance(step, int):
            name += f"[{first.get(position, 0) if step == ALL else step}]"
        else:
            name += f".{step}" if name else step
    return name


# (kind, path, wrong value, defects, first indices of ALL where the field first occurs)
RL_FIELDS = [
    (("data_source",), 7, ("missing", "null", "wrong"), {}),
    (("prompt",), "What is 1 + 1?", ("missing", "null", "wrong"), {}),
    (("prompt", ALL, "role"), 7, ("missing", "null", "wrong"), {}),
    (("prompt", ALL, "content"), 7, ("missing", "null", "wrong"), {}),
    (("reward_model",), "2", ("missing", "null", "wrong"), {}),
    (("reward_model", "ground_truth"), 2, ("missing", "null", "wrong"), {}),
    (("extra_info",), "row 0", ("wrong",), {}),
    (("agent_name",), 7, ("wrong",), {}),
]
CALL = ("messages", ALL, "tool_calls", ALL, "function")
SFT_FIELDS = [
    (("messages",), "What is 1 + 1?", ("missing", "null", "wrong"), {}),
    (("messages", ALL, "role"), 7, ("missing", "null", "wrong"), {}),
    (("messages", ALL, "content"), 7, ("missing", "null", "wrong"), {}),
    (CALL, "print(2)", ("missing", "null", "wrong"), {1: 1}),
    ((*CALL, "name"), 7, ("missing", "null", "wrong"), {1: 1}),
    ((*CALL, "arguments"), 7, ("missing", "null", "wrong"), {1: 1}),
    (("tools",), "code_interpreter", ("wrong",), {}),
]
CASES = [
    pytest.param(kind, path, wrong, defect, first, id=f"{kind}: {field_name(path, first)} {defect}")
    for kind, fields in (("rl", RL_FIELDS), ("eval", RL_FIELDS), ("sft", SFT_FIELDS))
    for path, wrong, defects, first in fields
    for defect in defects
]


def expected_problem(defect: str, wrong: Any) -> str:
    if defect in ("missing", "null"):
        return defect
    return f"{type(wrong).__name__} {wrong!r}, not "


@pytest.fixture(scope="module")
def stage_configs(prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, sandbox: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, str]:
    """The Ascend example's sft and rl stages composed as the preflight composes them, and the tokenizer."""
    from verl.utils import hf_tokenizer

    prepared = prepare("qwen7b-ascend")
    full = plan(prepared.run, prepared.context(sandbox))
    state = State()
    config_checks(state, full, PreflightOptions(tokenizer=qwen_tokenizer, work_dir=tmp_path_factory.mktemp("fields-work")))
    assert not [r for r in state.results if r.failed], state.results
    return state.configs, hf_tokenizer(qwen_tokenizer), prepared.run.spec.recipe


def run_check(kind: str, path: str, configs: dict[str, Any], tokenizer: Any, recipe: str) -> Any:
    config = copy.deepcopy(configs["sft" if kind == "sft" else "rl"])
    with open_dict(config):
        if kind in ("sft", "rl"):
            config.data.train_files = path
        else:
            config.data.val_files = [path]
    if kind == "sft":
        return check_sft(config, tokenizer, tool_format="hermes", sample=8, max_truncated_fraction=0.05)[0]
    if kind == "rl":
        return check_rl_data(config, tokenizer, "rl", recipe)[0]
    return check_eval_data(config, tokenizer, "rl", ["fields"], recipe)[0]


@pytest.mark.parametrize(("kind", "path", "wrong", "defect", "first"), CASES)
def test_a_bad_field_is_the_data_checks_failure_naming_file_row_and_field(
    kind: str, path: tuple[Any, ...], wrong: Any, defect: str, first: dict[int, int], stage_configs: tuple[dict[str, Any], Any, str], tmp_path: Path
) -> None:
    configs, tokenizer, recipe = stage_configs
    rows = broken(sft_rows() if kind == "sft" else rl_rows(), path, defect, wrong, first)
    file = tmp_path / f"{kind}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), file)
    result = run_check(kind, str(file), configs, tokenizer, recipe)
    check = {"sft": "sft-data", "rl": "rl-data", "eval": "eval-data"}[kind]
    assert result.check == check and result.status == "failed", result.summary
    assert exit_code([result]) == BY_NAME[check].exit_code == {"sft": 12, "rl": 13, "eval": 14}[kind]
    row = NULL_ROW if defect == "null" else 0
    field = field_name(path, first)
    assert f"{file} row {row}: field {field} is {expected_problem(defect, wrong)}" in result.summary
    assert "Traceback" not in result.summary


@pytest.mark.parametrize("kind", ["sft", "rl", "eval"])
def test_the_valid_rows_have_no_field_problem(kind: str, tmp_path: Path) -> None:
    file = tmp_path / f"{kind}.parquet"
    pq.write_table(pa.Table.from_pylist(sft_rows() if kind == "sft" else rl_rows()), file)
    assert file_problems(str(file), kind) == ([], 0)


def test_a_prompt_without_a_user_message_is_named(tmp_path: Path) -> None:
    rows = rl_rows()
    rows[1]["prompt"] = [{"role": "system", "content": "Be brief."}]
    file = tmp_path / "rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), file)
    problems, total = file_problems(str(file), "rl")
    assert (total, [str(p) for p in problems]) == (1, [f"{file} row 1: field prompt is a chat without a user message"])


def test_tool_call_arguments_given_as_json_text_are_valid(stage_configs: tuple[dict[str, Any], Any, str], tmp_path: Path) -> None:
    """The documented alternative to an object: an SFT tool call whose ``arguments`` is JSON text is
    no field problem, and verl's SFT dataset trains the call the rollout's parser reads back."""
    configs, tokenizer, recipe = stage_configs
    rows = sft_rows()
    for row in rows:
        row["messages"][1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"code": "print(1 + 1)"})
    file = tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist(rows), file)
    assert pq.read_schema(file).field("messages").type.value_type.field("tool_calls").type.value_type.field("function").type.field("arguments").type == pa.string()
    assert file_problems(str(file), "sft") == ([], 0)
    result = run_check("sft", str(file), configs, tokenizer, recipe)
    assert result.check == "sft-data" and result.status in ("passed", "warning"), result.summary
    assert "field" not in result.summary and "tool parser" not in result.summary
    assert (result.details["tool_parser"], result.details["rows_checked_token_by_token"]) == ("hermes", ROWS), "every row's call was parsed back"


BATCHED_ROWS = 2 * BATCH_ROWS + 200
"""Three of the field check's reading batches: a problem in the second or third must keep its true row."""


def test_a_problem_past_the_first_reading_batch_is_reported_at_its_true_row(stage_configs: tuple[dict[str, Any], Any, str], tmp_path: Path) -> None:
    configs, tokenizer, recipe = stage_configs
    rows = [rl_row(data_source="fields", question=f"What is {i} + 1?", ground_truth=str(i + 1), index=i, split="train", source_id=None) for i in range(BATCHED_ROWS)]
    bad = (3, BATCH_ROWS + 276, 2 * BATCH_ROWS + 100)
    for index in bad:
        rows[index]["reward_model"] = None
    file = tmp_path / "rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), file)
    problems, total = file_problems(str(file), "rl")
    assert (total, [p.row for p in problems]) == (len(bad), list(bad))
    result = run_check("rl", str(file), configs, tokenizer, recipe)
    assert result.status == "failed" and exit_code([result]) == 13, result.summary
    assert result.details["field_problems"] == [f"{file} row {index}: field reward_model is null" for index in bad]
