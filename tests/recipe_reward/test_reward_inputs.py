"""Whatever verl hands the reward, it answers with the same keys and types and never raises."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from retool.recipe.reward import score as score_module
from retool.recipe.reward.score import MAX_PRED_CHARS, compute_score

KEYS = {"score": float, "acc": float, "pred": str, "source": str, "reward_note": str}


def well_formed(result: dict[str, Any]) -> None:
    assert set(result) == set(KEYS)
    for key, kind in KEYS.items():
        assert type(result[key]) is kind, f"{key} is {type(result[key]).__name__}"
    assert result["score"] == 1.0 or -1.0 <= result["score"] <= -0.6
    assert result["acc"] == float(result["score"] == 1.0)
    assert len(result["pred"]) <= MAX_PRED_CHARS


ODD = [
    # (id, solution, truth, extra_info, kwargs, expected score, fragment of the note)
    ("bytes response", b"\\boxed{34}", "34", None, {}, -1.0, "bytes, not text"),
    ("no response", None, "34", None, {}, -1.0, "no response"),
    ("integer response", 34, "34", None, {}, -1.0, "int, not text"),
    ("no ground truth", "\\boxed{34}", None, None, {}, -1.0, "no usable ground truth"),
    ("NaN ground truth", "\\boxed{34}", float("nan"), None, {}, -1.0, "float is not an answer"),
    ("bytes ground truth", "\\boxed{34}", b"34", None, {}, -1.0, "bytes is not an answer"),
    ("mapping ground truth", "\\boxed{34}", {"answer": "34"}, None, {}, -1.0, "dict is not an answer"),
    ("boolean ground truth", "\\boxed{1}", True, None, {}, -1.0, "bool is not an answer"),
    ("too many ground truths", "\\boxed{34}", ["34", *(str(i) for i in range(100))], None, {}, 1.0, "first 16"),
    ("an accepted answer past the first 16 is not compared", "\\boxed{34}", [str(i) for i in range(100)], None, {}, -1.0, "first 16"),
    ("list extra_info is ignored", "\\boxed{34}", "34", [1, 2], {}, 1.0, "extra_info is a list"),
    ("string extra_info is ignored", "\\boxed{3}", "34", "num_turns=4", {"tool_turn_shaping": True}, -1.0, "extra_info is a str"),
    ("num_turns 'abc' falls back to the text", "<interpreter>1</interpreter> \\boxed{3}", "34", {"num_turns": "abc"}, {"tool_turn_shaping": True}, -0.9, "not a turn count"),
    ("NaN num_turns falls back to the text", "\\boxed{3}", "34", {"num_turns": float("nan")}, {"tool_turn_shaping": True}, -1.0, "not a turn count"),
    ("negative num_turns", "\\boxed{3}", "34", {"num_turns": -4}, {"tool_turn_shaping": True}, -1.0, "not a turn count"),
    ("numeric-string num_turns counts", "\\boxed{3}", "34", {"num_turns": "6"}, {"tool_turn_shaping": True}, -0.8, ""),
    ("tool_rewards that is not a list", "\\boxed{3}", "34", {"tool_rewards": 3}, {"tool_turn_shaping": True}, -1.0, "not a list"),
    ("shaping flag as a string", "\\boxed{3}", "34", {"num_turns": 6}, {"tool_turn_shaping": "true"}, -0.8, ""),
    ("shaping flag that is not a boolean", "\\boxed{3}", "34", {"num_turns": 6}, {"tool_turn_shaping": "maybe"}, -1.0, "not a boolean"),
    ("NaN timeout", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}", None, {"timeout_s": float("nan")}, 1.0, "timeout_s"),
]


@pytest.mark.parametrize(("solution", "truth", "extra_info", "kwargs", "score", "note"), [c[1:] for c in ODD], ids=[c[0] for c in ODD])
def test_odd_inputs_give_a_well_formed_result_with_a_reason(solution: Any, truth: Any, extra_info: Any, kwargs: dict, score: float, note: str) -> None:
    result = compute_score("dapo", solution, truth, extra_info, **kwargs)
    well_formed(result)
    assert result["score"] == pytest.approx(score)
    if note:
        assert note in result["reward_note"]
    else:
        assert result["reward_note"] == ""


@pytest.mark.parametrize("data_source", [b"aime_2024", 7, None], ids=["bytes", "int", "None"])
def test_an_odd_data_source_is_echoed_as_text(data_source: Any) -> None:
    result = compute_score(data_source, "\\boxed{34}", "34")
    well_formed(result)
    assert result["score"] == 1.0 and result["source"] in ("aime_2024", "7", "None")


def test_a_long_answer_is_cut_to_a_bounded_pred() -> None:
    result = compute_score("dapo", "\\boxed{" + "x+" * 5000 + "x}", "1")
    well_formed(result)
    assert result["pred"].endswith("...")


def test_an_internal_failure_is_a_minus_one_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> bool:
        raise RuntimeError("worker pool exploded")

    monkeypatch.setattr(score_module, "is_equivalent", broken)
    result = compute_score("dapo", "\\boxed{34}", "34")
    well_formed(result)
    assert result["score"] == -1.0 and "worker pool exploded" in result["reward_note"]


class SharedExtraInfo(Mapping):
    """One ``extra_info`` dict shared by the n samples of a prompt, as verl's repeated batch holds it.

    verl's reward loop writes each sample's tool results into it in place; this stand-in does what an
    interleaved sample does in the middle of our grading: the second read sees the next sample's values.
    """

    def __init__(self, mine: dict[str, Any], theirs: dict[str, Any]) -> None:
        self.data, self.theirs, self.reads = dict(mine), theirs, 0

    def __getitem__(self, key: str) -> Any:
        self.reads += 1
        value = self.data[key]
        self.data.update(self.theirs)  # another sample's update lands right after our first look
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


def test_the_reward_reads_one_snapshot_of_a_shared_extra_info() -> None:
    shared = SharedExtraInfo({"num_turns": 2, "tool_turn_shaping": True}, {"num_turns": 10})
    result = compute_score("dapo", "\\boxed{3}", "34", shared)
    assert result["score"] == -1.0, "this sample made no tool call; the 4 calls belong to another sample"
    assert shared.data["num_turns"] == 10 and "reward_note" not in shared.data, "the caller's dict is never written"


@pytest.mark.parametrize("value", [float("inf"), -0.0, 1e308, math.pi])
def test_float_turn_counts_that_are_not_whole_are_not_counts(value: float) -> None:
    result = compute_score("dapo", "\\boxed{3}", "34", {"num_turns": value}, tool_turn_shaping=True)
    well_formed(result)
    assert result["score"] <= -0.6
