"""ReTool-SFT -> multi-turn tool-calling messages that verl's MultiTurnSFTDataset trains on."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from retool.data.report import MalformedRowError
from retool.data.schema import ANSWER_INSTRUCTION, SFT_SCHEMA, TOOL_NAME, code_interpreter_tool
from retool.data.sft import convert_sft_row, extract_code, prepare_sft, retool_question, split_trajectory
from tests.data.helpers import RETOOL_TEXT, build_tokenizer, read_rows, retool_row, write_jsonl, write_parquet

USER = {"role": "user", "content": "q"}
TOOL = {"role": "tool", "content": "1"}
ANSWER = {"role": "assistant", "content": "a"}


def calling(name: str, arguments: object) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}


def call(code: str) -> list[dict]:
    return [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}]


@pytest.mark.parametrize(
    ("block", "code"),
    [
        pytest.param("\n```python\nprint(1)\n```\n", "print(1)", id="fenced python block"),
        pytest.param("\n```py\nx = 1\nprint(x)\n```\n", "x = 1\nprint(x)", id="py fence"),
        pytest.param("\n```python\na = 1\n```\nand\n```python\nb = 2\n```", "a = 1", id="first of two fenced blocks"),
        pytest.param("\nprint(2)\n", "print(2)", id="bare code"),
        pytest.param("\n```python\nprint(3)\n", "print(3)", id="unclosed fence"),
        pytest.param("\n```python\nfor i in range(2):\n    print(i)\n```", "for i in range(2):\n    print(i)", id="indentation kept"),
    ],
)
def test_extract_code(block: str, code: str) -> None:
    assert extract_code(block) == code


def test_split_trajectory_turns_code_into_tool_calls_and_interpreter_into_tool_turns() -> None:
    assert split_trajectory(RETOOL_TEXT) == [
        {"role": "assistant", "content": "Let me compute the sum with code.", "tool_calls": call("print(sum(range(10)))")},
        {"role": "tool", "content": "45", "tool_calls": None},
        {"role": "assistant", "content": "So the sum is 45. Now double it.", "tool_calls": call("x = 45 * 2\nprint(x)")},
        {"role": "tool", "content": "90", "tool_calls": None},
        {"role": "assistant", "content": "The result is 90.\n<answer>\n\\boxed{90}\n</answer>", "tool_calls": None},
    ]


def test_trajectory_without_code_is_one_answer() -> None:
    assert split_trajectory("Easy: 2.\n<answer>\\boxed{2}</answer>") == [{"role": "assistant", "content": "Easy: 2.\n<answer>\\boxed{2}</answer>", "tool_calls": None}]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("x <code>print(1)\n<interpreter>1</interpreter><answer>1</answer>", "unclosed <code> block", id="unclosed code"),
        pytest.param("x <code>print(1)</code> then <answer>1</answer>", "code block without interpreter output", id="no interpreter output"),
        pytest.param("x <interpreter>1</interpreter> <answer>1</answer>", "interpreter output without a preceding code block", id="interpreter without code"),
        pytest.param("x <code>```python\n```</code><interpreter></interpreter><answer>1</answer>", "empty code block", id="empty code"),
        pytest.param("x <code>print(1)</code><interpreter>1</interpreter> so 1.", "no final <answer>", id="no answer"),
        pytest.param("x <code>print(1)</code><interpreter>1</interpreter> </code> <answer>1</answer>", "stray </code>", id="stray closing tag"),
    ],
)
def test_malformed_trajectories_are_named(text: str, reason: str) -> None:
    with pytest.raises(MalformedRowError, match=reason):
        split_trajectory(text)


def test_multi_turn_input_is_normalised() -> None:
    row = {
        "messages": [
            {"role": "system", "content": "You are a mathematician."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": TOOL_NAME, "arguments": json.dumps({"code": "print(2+2)"})}}]},
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "\\boxed{4}"},
        ]
    }
    converted, how, rewritten = convert_sft_row(row)
    assert (how, rewritten) == ("multi_turn", False)
    assert converted["messages"][2] == {"role": "assistant", "content": "", "tool_calls": call("print(2+2)")}
    assert converted["tools"] == [code_interpreter_tool()]


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        pytest.param([{"role": "assistant", "content": "hi"}], "does not start with a user message", id="starts with the assistant"),
        pytest.param([{"role": "user", "content": "q"}], "not followed by an assistant", id="no assistant"),
        pytest.param([USER, TOOL, ANSWER], "does not follow a tool call", id="orphan tool turn"),
        pytest.param([USER, calling("search", {}), TOOL, ANSWER], "tool call to 'search'", id="another tool"),
        pytest.param([USER, calling(TOOL_NAME, "{oops"), TOOL, ANSWER], "arguments are not valid JSON", id="broken JSON arguments"),
        pytest.param([USER, calling(TOOL_NAME, {"code": 3}), TOOL, ANSWER], "without a code string", id="code is not a string"),
        pytest.param([USER, calling(TOOL_NAME, ["print(1)"]), TOOL, ANSWER], "arguments are not an object", id="arguments are a list"),
        pytest.param([USER, calling(TOOL_NAME, {"code": "1", "timeout": 3}), TOOL, ANSWER], "arguments other than code: timeout", id="extra arguments"),
        pytest.param([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "critic", "content": "?"}], "role 'critic'", id="unknown role"),
        pytest.param([USER, calling(TOOL_NAME, {"code": "1"})], "does not end with an assistant answer", id="ends with a tool call"),
        pytest.param(
            [USER, {"role": "assistant", "content": "", "tool_calls": calling(TOOL_NAME, {"code": "1"})["tool_calls"] * 2}, TOOL, TOOL, ANSWER],
            "2 tool calls in one turn",
            id="parallel tool calls",
        ),
    ],
)
def test_malformed_conversations_are_named(messages: list, reason: str) -> None:
    with pytest.raises(MalformedRowError, match=reason):
        convert_sft_row({"messages": messages})


def test_prepare_sft_from_jsonl_reports_malformed_rows(tmp_path) -> None:
    rows = [retool_row(), "{broken", retool_row("no tags and no answer"), retool_row("Plain.\n<answer>\\boxed{1}</answer>")]
    out = tmp_path / "sft.parquet"
    summary = prepare_sft(str(write_jsonl(tmp_path / "sft.jsonl", rows)), str(out), max_malformed_fraction=1.0)  # counting, not the limit
    assert (summary.rows_read, summary.rows_written, summary.malformed) == (4, 2, 2)
    assert [e.where.rsplit("#", 1)[1] for e in summary.malformed_examples] == ["2", "3"]  # jsonl line numbers
    assert summary.counters == {"converted_from_tags": 2, "already_multi_turn": 0, "tool_calls": 2, "prompts_rewritten": 0}
    assert pq.read_schema(out).equals(SFT_SCHEMA, check_metadata=False)
    first = read_rows(out)[0]
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert first["tools"] == [code_interpreter_tool()]


@pytest.mark.parametrize("pad_mode", ["right", "no_padding"])
def test_verl_multiturn_sft_dataset_trains_on_assistant_turns_only(tmp_path, pad_mode: str) -> None:
    """verl's own dataset loads the output; the loss covers code and answers, never interpreter output."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    text = RETOOL_TEXT.replace("<interpreter>\n45\n</interpreter>", "<interpreter>\nSECRET-OUTPUT-45\n</interpreter>")
    rows = [retool_row(text), {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<answer>\\boxed{2}</answer>"}]}]
    out = tmp_path / "sft.parquet"
    prepare_sft(str(write_parquet(tmp_path / "in.parquet", rows)), str(out))
    tokenizer = build_tokenizer()
    config = {"max_length": 1024, "truncation": "error", "pad_mode": pad_mode, "multiturn": {"messages_key": "messages", "tools_key": "tools"}}
    dataset = MultiTurnSFTDataset(str(out), tokenizer, config=config)
    assert len(dataset) == 2
    item = dataset[0]
    ids, mask = item["input_ids"], item["loss_mask"]
    trained = tokenizer.decode(ids[mask.bool()])
    whole = tokenizer.decode(ids)
    assert "SECRET-OUTPUT-45" in whole and "SECRET-OUTPUT-45" not in trained
    assert '"arguments": {"code": "print(sum(range(10)))"}' in trained  # a dict rendered once by tojson, not a JSON string
    assert "\\boxed{90}" in trained
    assert "code_interpreter" in whole.split("<|im_start|>user")[0]  # the tool schema is in the system block


RETOOL_PROMPT = (
    "Solve the following problem step by step. You now have the ability to selectively write executable Python code to enhance your reasoning process. "
    "The Python code will be executed by an external sandbox, and the output (wrapped in `<interpreter>output_str</interpreter>`) can be returned to aid "
    "your reasoning and help you arrive at the final answer. The Python code should be complete scripts, including necessary imports. \n"
    "Each code snippet is wrapped with `<code>\n```python\ncode snippet\n```\n</code>`.\n"
    "The last part of your response should be in the following format:\n<answer>\n\\boxed{'The final answer goes here.'}\n</answer>\n\n"
    "*user question:*\n{question}\n\n"
    "Remember to place the final answer in the last part using the format: \n<answer>\n\\boxed{'The final answer goes here.'}\n</answer>"
)


@pytest.mark.parametrize(
    ("content", "question"),
    [
        pytest.param(RETOOL_PROMPT.replace("{question}", "What is $2+2$?\nGive an integer."), "What is $2+2$?\nGive an integer.", id="ReTool-SFT prompt"),
        pytest.param("**User Question:**\nFind x.", "Find x.", id="bold marker"),
        pytest.param("What is 2+2?", None, id="a plain prompt is not rewritten"),
    ],
)
def test_retool_question(content: str, question: str | None) -> None:
    assert retool_question(content) == question


@pytest.mark.parametrize(("rewrite", "expected_rewritten"), [(True, 1), (False, 0)], ids=["rewritten by default", "kept on request"])
def test_retool_prompts_get_the_single_answer_instruction(tmp_path, rewrite: bool, expected_rewritten: int) -> None:
    prompt = RETOOL_PROMPT.replace("{question}", "What is twice the sum of 0..9?")
    source = write_jsonl(tmp_path / "sft.jsonl", [retool_row(question=prompt)])
    summary = prepare_sft(str(source), str(tmp_path / "sft.parquet"), rewrite_prompts=rewrite)
    user = read_rows(tmp_path / "sft.parquet")[0]["messages"][0]["content"]
    assert summary.counters["prompts_rewritten"] == expected_rewritten
    if rewrite:
        assert user == f"What is twice the sum of 0..9?\n\n{ANSWER_INSTRUCTION}"
    else:
        assert user == prompt
