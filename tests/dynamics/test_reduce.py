"""The tool-use dynamics reduction and the reward-watch decisions, as tables of batches with known figures."""

from __future__ import annotations

import numpy as np
import pytest

from retool.recipe.dynamics import OUTCOME_CLASS, code_lines, outcome_class, reduce_dynamics, tool_record
from retool.recipe.reward_watch import WatchSettings, count_boxed, disagreement_metrics, hacking_signals, sample_rows, sample_size

R = tool_record

DYNAMICS = [
    pytest.param(
        [R(["ok"], [3], 40), None, R(["code_failed", "ok"], [2, 4], 10, hit_max_turns=True), None],
        [True, False, False, True],
        [100, 50, 200, 80],
        {
            "tool/responses": 4.0,
            "tool/correct_ratio": 0.5,
            "tool/code_ratio": 0.5,
            "tool/calls_per_response_mean": 0.75,
            "tool/calls_per_response_max": 2.0,
            "tool/hit_max_turns_ratio": 0.25,
            "tool/calls": 3.0,
            "tool/code_lines_per_call_mean": 3.0,
            "tool/code_lines_per_response_mean": (3 + 6) / 2,
            "tool/outcome_success_count": 2.0,
            "tool/outcome_error_count": 1.0,
            "tool/outcome_timeout_count": 0.0,
            "tool/outcome_sandbox_failure_count": 0.0,
            "tool/outcome_success_rate": 2 / 3,
            "tool/outcome_error_rate": 1 / 3,
            "tool/outcome_timeout_rate": 0.0,
            "tool/outcome_sandbox_failure_rate": 0.0,
            "tool/code_pass_rate_correct": 1.0,
            "tool/code_pass_rate_incorrect": 0.5,
            "tool/first_call_position_mean": (0.4 + 0.05) / 2,
            "tool/response_length_correct_mean": 90.0,
            "tool/response_length_incorrect_mean": 125.0,
        },
        id="a mixed batch gives every figure",
    ),
    pytest.param(
        [None, None],
        [True, False],
        [10, 30],
        {
            "tool/responses": 2.0,
            "tool/correct_ratio": 0.5,
            "tool/code_ratio": 0.0,
            "tool/calls_per_response_mean": 0.0,
            "tool/calls_per_response_max": 0.0,
            "tool/hit_max_turns_ratio": 0.0,
            "tool/calls": 0.0,
            **{f"tool/outcome_{c}_count": 0.0 for c in ("success", "error", "timeout", "sandbox_failure")},
            "tool/response_length_correct_mean": 10.0,
            "tool/response_length_incorrect_mean": 30.0,
        },
        id="a text-only batch has no call figures and no rates over zero calls",
    ),
    pytest.param(
        [R(["timeout", "overloaded", "malformed", "something new"], [1, 0, 0, 2], 500)],
        [False],
        [400],
        {
            "tool/responses": 1.0,
            "tool/correct_ratio": 0.0,
            "tool/code_ratio": 1.0,
            "tool/calls_per_response_mean": 4.0,
            "tool/calls_per_response_max": 4.0,
            "tool/hit_max_turns_ratio": 0.0,
            "tool/calls": 4.0,
            "tool/code_lines_per_call_mean": 0.75,
            "tool/code_lines_per_response_mean": 3.0,
            "tool/outcome_success_count": 0.0,
            "tool/outcome_error_count": 2.0,
            "tool/outcome_timeout_count": 1.0,
            "tool/outcome_sandbox_failure_count": 1.0,
            "tool/outcome_success_rate": 0.0,
            "tool/outcome_error_rate": 0.5,
            "tool/outcome_timeout_rate": 0.25,
            "tool/outcome_sandbox_failure_rate": 0.25,
            "tool/code_pass_rate_incorrect": 0.0,
            "tool/first_call_position_mean": 1.0,
            "tool/response_length_incorrect_mean": 400.0,
        },
        id="failures are classed, an unknown outcome is an error, and a position past a truncated end is capped at 1",
    ),
]


@pytest.mark.parametrize(("records", "correct", "lengths", "expected"), DYNAMICS)
def test_reduce_dynamics(records: list, correct: list, lengths: list, expected: dict) -> None:
    assert reduce_dynamics(records, correct, lengths) == pytest.approx(expected)


def test_validation_figures_carry_their_own_prefix_and_an_empty_batch_has_none() -> None:
    assert set(reduce_dynamics([None], [True], [5], "val-tool")) >= {"val-tool/code_ratio", "val-tool/responses"}
    assert reduce_dynamics([], [], []) == {}


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="one of each per response"):
        reduce_dynamics([None, None], [True], [1, 2])


@pytest.mark.parametrize(("outcome", "cls"), sorted(OUTCOME_CLASS.items()), ids=[f"{o} is {c}" for o, c in sorted(OUTCOME_CLASS.items())])
def test_every_tool_outcome_has_a_class(outcome: str, cls: str) -> None:
    assert outcome_class(outcome) == cls


@pytest.mark.parametrize(
    ("code", "lines"),
    [
        ("a = 1\n\n  \nprint(a)\n", 2),
        ("```python\na = 1\nprint(a)\n```", 2),
        ("Let me compute.\n```py\nprint(2 ** 10)\n```\nThat is all.", 1),
        ("```\nx = 3\n\nprint(x)\n```", 2),
        ("", 0),
        (None, 0),
        ({"code": 1}, 0),
    ],
    ids=["blank lines do not count", "a python fence's lines are not code", "prose around a fence is not code", "an untagged fence", "empty", "None", "not text"],
)
def test_code_lines(code: object, lines: int) -> None:
    assert code_lines(code) == lines


@pytest.mark.parametrize(
    ("n", "share", "cap", "k"),
    [(8192, 0.02, 64, 64), (1000, 0.02, 64, 20), (10, 0.02, 64, 1), (10, 0.0, 64, 0), (10, 1.0, 0, 0), (0, 0.5, 8, 0), (5, 1.0, 64, 5)],
    ids=[
        "the cap bounds a recipe-sized step",
        "a share of a small step",
        "at least one when sharing",
        "share 0 is off",
        "cap 0 is off",
        "an empty batch",
        "never more than the batch",
    ],
)
def test_sample_size(n: int, share: float, cap: int, k: int) -> None:
    assert sample_size(n, share, cap) == k


def test_sampled_rows_are_distinct_sorted_and_reproducible_per_step() -> None:
    settings = WatchSettings(share=0.5, max_per_step=10)
    rows = sample_rows(100, settings, step=3)
    assert len(set(rows.tolist())) == 10 and list(rows) == sorted(rows)
    assert np.array_equal(rows, sample_rows(100, settings, step=3))
    assert not np.array_equal(rows, sample_rows(100, settings, step=4))


@pytest.mark.parametrize("bad", [{"share": 1.5}, {"max_per_step": -1}, {"benign_rate": 1.5}, {"false_alarm": 0.0}], ids=str)
def test_watch_settings_refuse_values_out_of_range(bad: dict) -> None:
    with pytest.raises(ValueError):
        WatchSettings(**bad)


def test_disagreement_rates_and_their_directions() -> None:
    metrics = disagreement_metrics([True, True, False, False], [True, False, True, False])
    assert metrics == {
        "reward-watch/verified": 4.0,
        "reward-watch/disagreement_rate": 0.5,
        "reward-watch/reward_wrong_verifier_right": 0.25,
        "reward-watch/reward_right_verifier_wrong": 0.25,
    }
    assert disagreement_metrics([], []) == {"reward-watch/verified": 0.0}


HACKING = [
    pytest.param(
        [R(["code_failed"], [1], 5, outputs=["Traceback"]), R(["ok"], [1], 5, outputs=["42"]), R(["ok"], [1], 5, outputs=["7"]), R([], [], None)],
        [True, True, True, False],
        ["42", "42", "8", "1"],
        [False, False, True, False],
        {
            "reward-watch/truncated_correct": 1 / 3,
            "reward-watch/correct_without_success": 1 / 3,
            "reward-watch/answer_from_tool_output": 1 / 3,
        },
        id="each signal counts among correct responses only",
    ),
    pytest.param([None, None], [True, False], None, [True, True], {"reward-watch/truncated_correct": 1.0}, id="a text-only run has no tool signals"),
    pytest.param([R(["ok"], [1], 1)], [False], ["1"], [True], {}, id="no correct response, no rates"),
]


@pytest.mark.parametrize(("records", "correct", "preds", "truncated", "expected"), HACKING)
def test_hacking_signals(records: list, correct: list, preds: list | None, truncated: list, expected: dict) -> None:
    assert hacking_signals(records, correct, preds, truncated) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "count"), [("\\boxed{1} or \\boxed{2}", 2), ("\\fbox{3}", 1), ("none", 0), ("\\boxedx{1}", 0)], ids=["two boxes", "fbox", "none", "a longer command is not a box"]
)
def test_count_boxed(text: str, count: int) -> None:
    assert count_boxed(text) == count

