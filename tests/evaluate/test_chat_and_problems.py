"""Pure parts of ``retool eval``: chat request/answer handling and problem files."""

from __future__ import annotations

import json
import re

import pytest

from retool.evaluate.chat import AssistantTurn, EndpointError, Sampling, ToolCall, chat_request, completions_url, parse_completion
from retool.evaluate.problems import ProblemFileError, load_problems, problem_from_row
from retool.evaluate.tools import call_code


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://h:8000", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1", "http://h:8000/v1/chat/completions"),
        ("https://api.example/v1/chat/completions", "https://api.example/v1/chat/completions"),
    ],
    ids=["bare host", "trailing slash", "already /v1", "full path"],
)
def test_completions_url(endpoint, url):
    assert completions_url(endpoint) == url


def test_chat_request_sends_tools_and_only_set_sampling_fields():
    body = chat_request("m", [{"role": "user", "content": "q"}], [{"type": "function"}], Sampling(temperature=0.7, top_p=0.6))
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.6,
        "tools": [{"type": "function"}],
        "tool_choice": "auto",
    }


def _choice(message, finish="stop"):
    return {"choices": [{"message": message, "finish_reason": finish}]}


@pytest.mark.parametrize(
    ("payload", "content", "calls", "finish"),
    [
        (_choice({"role": "assistant", "content": "x"}), "x", (), "stop"),
        (_choice({"role": "assistant", "content": None}), "", (), "stop"),
        (
            _choice({"content": "", "tool_calls": [{"id": "c1", "function": {"name": "code_interpreter", "arguments": '{"code": "1"}'}}]}, "tool_calls"),
            "",
            (ToolCall("c1", "code_interpreter", '{"code": "1"}'),),
            "tool_calls",
        ),
        (
            _choice({"content": "a", "tool_calls": [{"function": {"name": "code_interpreter", "arguments": {"code": "2"}}}]}, "tool_calls"),
            "a",
            (ToolCall("call_3_0", "code_interpreter", '{"code": "2"}'),),
            "tool_calls",
        ),
    ],
    ids=["plain answer", "null content", "tool call", "object arguments and no id get normalised"],
)
def test_parse_completion(payload, content, calls, finish):
    turn = parse_completion(payload, turn_index=3)
    assert (turn.content, turn.tool_calls, turn.finish_reason) == (content, calls, finish)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "not a JSON object"),
        ({"choices": []}, "no 'choices'"),
        ({"choices": [{"text": "legacy"}]}, "no 'message'"),
        (_choice({"tool_calls": [{"function": {"arguments": "{}"}}]}), "tool_calls[0] has no function name"),
    ],
    ids=["not an object", "empty choices", "completions API answer", "nameless tool call"],
)
def test_parse_completion_rejects(payload, message):
    with pytest.raises(EndpointError, match=re.escape(message)):
        parse_completion(payload)


@pytest.mark.parametrize(
    ("call", "code", "error"),
    [
        (ToolCall("1", "code_interpreter", '{"code": "print(1)"}'), "print(1)", None),
        (ToolCall("1", "python", '{"code": "print(1)"}'), None, "unknown tool 'python'"),
        (ToolCall("1", "code_interpreter", '{"code": "print(1)"'), None, "not valid JSON"),
        (ToolCall("1", "code_interpreter", '["print(1)"]'), None, "must be a JSON object"),
        (ToolCall("1", "code_interpreter", '{"code": 5}'), None, "non-empty string"),
        (ToolCall("1", "code_interpreter", ""), None, "non-empty string"),
    ],
    ids=["good call", "unknown tool", "truncated JSON", "arguments not an object", "code not a string", "no arguments"],
)
def test_tool_call_arguments(call, code, error):
    got_code, got_error = call_code(call)
    assert got_code == code
    if error is None:
        assert got_error is None
    else:
        assert error in got_error


@pytest.mark.parametrize(
    ("row", "prompt", "truth", "source"),
    [
        (
            {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "12"}, "data_source": "aime_2024"},
            ({"role": "user", "content": "q"},),
            "12",
            "aime_2024",
        ),
        ({"problem": "q", "answer": 7}, ({"role": "user", "content": "q"},), "7", "aime"),
        ({"Problem": "q", "Answer": " 033 "}, ({"role": "user", "content": "q"},), "033", "aime"),
    ],
    ids=["verl eval row", "aime 2025 layout", "aime 2024 layout"],
)
def test_problem_from_row(row, prompt, truth, source):
    problem = problem_from_row(row, 0)
    assert (problem.prompt, problem.ground_truth, problem.data_source) == (prompt, truth, source)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "1"}, "missing 'prompt'"),
        ({"prompt": [{"content": "q"}], "answer": "1"}, "'role' and 'content'"),
        ({"prompt": "q"}, "missing 'reward_model.ground_truth'"),
        ({"prompt": "q", "reward_model": {"ground_truth": ""}}, "missing 'reward_model.ground_truth'"),
    ],
    ids=["no prompt", "message without role", "no answer", "empty answer"],
)
def test_problem_from_row_rejects(row, message):
    with pytest.raises(ProblemFileError, match=message):
        problem_from_row(row, 0)


def test_load_problems_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"problem": "q", "answer": 1}) + "\n{not json\n")
    with pytest.raises(ProblemFileError, match=r"p.jsonl:2: not JSON"):
        load_problems(path)


def test_load_problems_reads_parquet_and_limits(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": str(i)}, "data_source": "aime_2025"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "e.parquet")
    problems = load_problems(tmp_path / "e.parquet", limit=3)
    assert [p.ground_truth for p in problems] == ["0", "1", "2"]
    assert problems[2].prompt == ({"role": "user", "content": "q2"},)


@pytest.mark.parametrize("name", ["missing.jsonl", "rows.csv"], ids=["missing file", "unsupported type"])
def test_load_problems_bad_files(tmp_path, name):
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ProblemFileError, match=name.split(".")[0]):
        load_problems(tmp_path / name)


@pytest.mark.parametrize(
    ("content", "calls", "sent"),
    [
        pytest.param("Let me compute.\n", True, "Let me compute.", id="the newline before a call is dropped: the template writes it back"),
        pytest.param("Let me compute.\n\n", True, "Let me compute.\n", id="only one newline is dropped"),
        pytest.param("", True, "", id="a call at the start of the turn"),
        pytest.param("The answer is 4.\n", False, "The answer is 4.\n", id="an answer without a call is sent as written"),
    ],
)
def test_the_assistant_message_sent_back_is_the_text_the_model_generated(content: str, calls: bool, sent: str) -> None:
    tool_calls = (ToolCall(id="call_0", name="code_interpreter", arguments='{"code": "print(1)"}'),) if calls else ()
    assert AssistantTurn(content=content, tool_calls=tool_calls).message()["content"] == sent
