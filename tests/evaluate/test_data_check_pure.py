"""Pure parts of ``retool data check``: reading trajectories in both layouts, comparing outputs."""

from __future__ import annotations

import json

import pytest

from retool.data_check.compare import ERROR_MATCH, MATCH, MISMATCH, NOT_RECORDED, NUMERIC_MATCH, compare_output, final_exception
from retool.data_check.trajectories import CodeStep, TrajectoryError, parse_trajectory

RAW = {
    "messages": [
        {"role": "user", "content": "Solve with code.\n\n*user question:*\nWhat is 6 x 7?"},
        {
            "role": "assistant",
            "content": "Compute.\n<code>\n```python\nprint(6 * 7)\n```\n</code>\n<interpreter>\n42\n</interpreter>\n"
            "Check again.\n<code>\n```python\nx = 6\nx * 7\n```\n</code>\n<interpreter>\n42\n</interpreter>\nSo <answer>\\boxed{42}</answer>",
        },
    ],
    "answer": "42",
}

def tool_call(arguments, call_id=None):
    call = {"type": "function", "function": {"name": "code_interpreter", "arguments": arguments}}
    return call | ({"id": call_id} if call_id else {})


MULTI_TURN = {
    "messages": [
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": "Compute.", "tool_calls": [tool_call({"code": "print(6 * 7)"}, "a")]},
        {"role": "tool", "tool_call_id": "a", "content": "42\n"},
        {"role": "assistant", "content": "Again.", "tool_calls": [tool_call(json.dumps({"code": "```python\nprint(42)\n```"}))]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "\\boxed{42}"},
    ],
    "reward_model": {"ground_truth": "42"},
}


def test_question_is_taken_after_the_published_marker():
    assert parse_trajectory(RAW, 0).question == "What is 6 x 7?"


@pytest.mark.parametrize(
    ("row", "steps", "final_text", "truth"),
    [
        (RAW, (CodeStep("print(6 * 7)", "42"), CodeStep("x = 6\nx * 7", "42")), "So <answer>\\boxed{42}</answer>", "42"),
        (MULTI_TURN, (CodeStep("print(6 * 7)", "42"), CodeStep("print(42)", "42")), "\\boxed{42}", "42"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<code>print(1)</code> then \\boxed{1}"}]},
            (CodeStep("print(1)", None),),
            "then \\boxed{1}",
            None,
        ),
    ],
    ids=["published ReTool-SFT layout", "multi-turn tool_calls layout", "unfenced code without recorded output"],
)
def test_parse_trajectory(row, steps, final_text, truth):
    trajectory = parse_trajectory(row, 3)
    assert trajectory.steps == steps
    assert trajectory.final_text == final_text
    assert trajectory.ground_truth == truth



@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "x"}, "missing 'messages'"),
        ({"messages": [{"role": "user", "content": "q"}]}, "needs a user and an assistant"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{oops"}}]}]},
            r"messages\[1\].tool_calls\[0\]: arguments are not JSON",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": {"code": 1}}}]}]},
            "'code' must be a string",
        ),
    ],
    ids=["no messages", "no assistant", "arguments not JSON", "code not a string"],
)
def test_parse_trajectory_rejects(row, message):
    with pytest.raises(TrajectoryError, match=message):
        parse_trajectory(row, 5)


@pytest.mark.parametrize(
    ("recorded", "actual", "verdict"),
    [
        ("42\n", "42", MATCH),
        ("a  \r\nb\n\n", "a\nb", MATCH),
        ("0.333333333333333", "0.3333333333333333", NUMERIC_MATCH),
        ("[1.0, 2.5]", "[1.0000000001, 2.5]", NUMERIC_MATCH),
        ("x = 0.33", "x = 0.34", MISMATCH),
        (
            'Traceback (most recent call last):\n  File "/tmp/a.py", line 3\nNameError: name \'f\' is not defined',
            'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\nNameError: name \'f\' is not defined',
            ERROR_MATCH,
        ),
        ("NameError: name 'f' is not defined", "NameError: name 'g' is not defined", MISMATCH),
        ("42", "43", MISMATCH),
        (None, "42", NOT_RECORDED),
    ],
    ids=[
        "equal up to trailing newline",
        "line endings and trailing spaces",
        "float printed with another precision",
        "numbers inside a list",
        "different numbers",
        "same error, different traceback",
        "different errors",
        "different output",
        "nothing recorded",
    ],
)
def test_compare_output(recorded, actual, verdict):
    assert compare_output(recorded, actual).verdict == verdict


def test_mismatch_carries_a_diff():
    comparison = compare_output("1\n2\n3", "1\n5\n3")
    assert "-2" in comparison.diff and "+5" in comparison.diff
    assert 0 < comparison.similarity < 1


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Traceback...\nZeroDivisionError: division by zero", "ZeroDivisionError: division by zero"),
        ("sympy.core.sympify.SympifyError: bad", "sympy.core.sympify.SympifyError: bad"),
        ("all good\n42", None),
    ],
    ids=["builtin exception", "qualified exception", "no exception"],
)
def test_final_exception(text, line):
    assert final_exception(text) == line


def _report(*trajectories: tuple[list[str], bool | None]):
    """A check report of trajectories given as (block verdicts, answer correct or None when unscored)."""
    from retool.data_check.check import CheckReport, StepReport, TrajectoryReport

    return CheckReport(
        source="rows.jsonl",
        trajectories=[
            TrajectoryReport(
                index=i,
                question="q",
                steps=[StepReport(n, v, 1.0, "Finished", 0.5) for n, v in enumerate(verdicts)],
                ground_truth=None if acc is None else "1",
                pred="1",
                acc=acc,
            )
            for i, (verdicts, acc) in enumerate(trajectories)
        ],
    )


@pytest.mark.parametrize(
    ("trajectories", "present", "absent"),
    [
        pytest.param([([MATCH, MISMATCH], True)], {"data_check/output_agreement": 0.5, "data_check/answer_accuracy": 1.0}, set(), id="both measured"),
        pytest.param(
            [([MATCH], None), ([MATCH], None)],
            {"data_check/output_agreement": 1.0, "data_check/answers_scored": 0.0},
            {"data_check/answer_accuracy"},
            id="no ground truth: no answer accuracy, not 0",
        ),
        pytest.param(
            [([NOT_RECORDED], False)], {"data_check/answer_accuracy": 0.0}, {"data_check/output_agreement"}, id="no recorded output: no output agreement, not 100%"
        ),
    ],
)
def test_a_share_is_reported_only_when_something_was_measured(trajectories, present, absent):
    metrics = _report(*trajectories).metrics()
    assert {k: metrics.get(k) for k in present} == present
    assert not absent & metrics.keys()
