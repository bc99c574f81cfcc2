"""The preflight's ``reward-watch`` check: the second verifier's benign disagreement measured on the run's RL data.

The measurement runs the real reward and the real second verifier (math-verify) on parquet rows in
the shape ``retool data prepare`` writes; the verdicts are checked on measurements whose counts are
given, against the spec's alarm settings. No verl: the runners hand the check the reward verl loads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.preflight.reward_watch import OVER_SET, Measurement, check_reward_watch, judge, measure, reference_answers, reward_says_right, run_settings
from retool.recipe.reward.score import compute_score
from retool.recipe.reward_alarm import recommended_benign_rate, upper_bound
from retool.recipe.reward_watch import WatchSettings
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from tests.conftest import REPO
from tests.data.helpers import dapo_row, write_parquet

EXAMPLE = REPO / "examples" / "retoolrun-qwen32b-h200.yaml"
ROWS = 600
"""As many RL rows as the preflight tests' prepared data holds (tests/preflight/sources.py)."""


def example_run(**watch: Any) -> RetoolRun:
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    if watch:
        document["spec"]["rl"]["rewardWatch"] = watch
    return parse_run(document)


@pytest.fixture(scope="module")
def integer_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [dapo_row(f"What is {i} + {i + 1}?", str(2 * i + 1), index=f"dapo-{i}") for i in range(ROWS)]
    return write_parquet(tmp_path_factory.mktemp("rl") / "rl.parquet", rows)


def test_integer_answers_measure_no_disagreement_and_the_defaults_pass(integer_data: Path) -> None:
    result = check_reward_watch(example_run(), str(integer_data), compute_score)
    assert result.status == "passed", result.summary
    details = result.details
    assert (details["disagreed"], details["graded"], details["unknown"], details["rows_graded"]) == (0, 2 * ROWS, 0, ROWS)
    assert details["recommended_benign_rate"] == 0.01 and details["upper_bound_95"] == pytest.approx(upper_bound(0, 2 * ROWS), abs=1e-5)
    assert "0 of 1200 graded reference answers" in result.summary and "at most 0.25%" in result.summary
    assert details["plus_10_within_20_simulated"] >= 0.95 and details["false_alarms_simulated"] <= 0.01


def test_the_former_default_is_warned_about_with_what_it_costs(integer_data: Path) -> None:
    result = check_reward_watch(example_run(benignRate=0.1, shift=0.15), str(integer_data), compute_score)
    assert result.status == "warning", result.summary
    assert "benignRate 0.1 is far above it" in result.summary and "climbs on average only above 16.6% disagreement" in result.summary
    assert result.details["plus_10_within_20_simulated"] < 0.01 and result.details["plus_10_within_20_at_recommended"] >= 0.95
    assert result.summary.endswith("set benignRate to 0.01")


def judged(disagreed: int, graded: int, **settings: Any) -> Any:
    return judge(Measurement(disagreed=disagreed, graded=graded, rows=graded, right=(disagreed, graded), wrong=(0, 0)), WatchSettings(horizon=400, **settings), 64)


@pytest.mark.parametrize(
    ("disagreed", "graded", "settings", "status", "words"),
    [
        (0, 1200, {}, "passed", "is at or above its upper bound (recommended 0.01)"),
        (3, 300, {}, "passed", "is within its bounds (recommended 0.026)"),
        (30, 300, {}, "warning", "benignRate 0.01 is below it, so RewardSuspect's false-alarm bound does not hold"),
        (30, 300, {"benign_rate": 0.134}, "passed", "is at or above its upper bound (recommended 0.134)"),
        (30, 300, {"benign_rate": 0.3, "shift": 0.1}, "warning", "benignRate 0.3 is far above it"),
        (0, 1200, {"benign_rate": 0.02}, "passed", "is at or above its upper bound"),
        (0, 1200, {"benign_rate": 0.021}, "warning", "far above it"),
        (290, 300, {"benign_rate": 0.5, "shift": 0.1}, "warning", "no benignRate leaves room for spec.rl.rewardWatch.shift 0.1"),
    ],
    ids=[
        "none measured at the default",
        "1 % measured: the default is inside the bounds",
        "10 % measured against the default: under-set",
        "10 % measured, benignRate its recommendation",
        "10 % measured, benignRate 0.3: over-set",
        "twice the recommendation is not yet over-set",
        "just above twice the recommendation is",
        "a verifier that disagrees on almost everything",
    ],
)
def test_the_verdict_follows_the_measured_bounds(disagreed: int, graded: int, settings: dict[str, float], status: str, words: str) -> None:
    result = judged(disagreed, graded, **settings)
    assert (result.status, result.check, result.scope) == (status, "reward-watch", "rl"), result.summary
    assert words in result.summary


def test_an_under_set_benign_rate_states_the_false_alarms_it_causes() -> None:
    result = judged(30, 300)
    assert result.details["false_alarms_simulated"] > 0.9, "10 % true against a benignRate of 1 %: nearly every run raises it"
    assert f"{result.details['false_alarms_simulated']:.1%} of simulated 400-step runs raise it" in result.summary
    assert result.summary.endswith(f"set benignRate to {recommended_benign_rate(30, 300):g}")


def test_over_set_means_more_than_twice_the_recommendation() -> None:
    assert OVER_SET == 2.0


def test_the_under_set_warning_is_wrong_in_at_most_five_percent_of_measurements() -> None:
    """True rate = benignRate = 0.05, 600 graded: the warning needs the lower bound above 0.05, which a true 5 % gives in <= 5 % of draws.

    Exactly: the smallest count whose lower bound exceeds 0.05, and its binomial tail (no simulation needed for this one).
    """
    from retool.recipe.reward_alarm import _binomial_cdf, lower_bound

    graded, rate = 600, 0.05
    first = next(x for x in range(graded + 1) if lower_bound(x, graded) > rate)
    assert judged(first, graded, benign_rate=rate).status == "warning" and judged(first - 1, graded, benign_rate=rate).status == "passed"
    assert 1.0 - _binomial_cdf(first - 1, graded, rate) <= 0.05


def test_measure_counts_each_direction_and_leaves_unknowns_out() -> None:
    """A verifier that rejects the truth "7", accepts anything against "9" and cannot read "u"."""

    def verdict(response: str, truth: str) -> str:
        answer = response.split("\\boxed{")[1].split("}")[0]
        if truth == "u":
            return "unknown"
        if truth == "9":
            return "correct"
        return "correct" if answer == truth and truth != "7" else "wrong"

    def score(*, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> dict[str, float]:
        return {"score": 1.0 if f"\\boxed{{{ground_truth}}}" in solution_str else -1.0, "acc": float(f"\\boxed{{{ground_truth}}}" in solution_str)}

    found = measure([("s", "7"), ("s", "9"), ("s", "u"), ("s", "3")], score, verdict)
    # right answers: 7 rejected (disagree), 9 and 3 agree; wrong answers: 9's (the "u" row's truth is wrong for it) accepted (disagree).
    assert (found.right, found.wrong, found.unknown, found.rows, found.stopped_early) == ((1, 3), (1, 3), 2, 4, False)
    assert (found.disagreed, found.graded) == (2, 6)
    assert [e["second_verifier"] for e in found.examples] == ["wrong", "correct"]


def test_measure_stops_at_its_time_limit_and_says_so() -> None:
    found = measure([("s", "1")] * 5, lambda **_: 1.0, lambda *_: "correct", seconds=0.0)
    assert found.stopped_early and found.graded == 0


def test_reward_says_right_reads_acc_first_then_the_score() -> None:
    assert [reward_says_right(r) for r in ({"score": 1.0, "acc": 0.0}, {"score": -1.0, "acc": 1.0}, {"score": 0.5}, -1.0, 1)] == [False, True, True, False, True]


def test_reference_answers_are_a_seeded_sample_of_the_files(tmp_path: Path) -> None:
    first = write_parquet(tmp_path / "a.parquet", [dapo_row(f"q{i}", str(i)) for i in range(30)])
    second = write_parquet(tmp_path / "b.parquet", [dapo_row(f"r{i}", str(100 + i), data_source="other") for i in range(30)])
    answers, total = reference_answers([str(first), str(second)], rows=10, seed=4)
    assert total == 60 and len(answers) == 10 and len({truth for _, truth in answers}) == 10
    assert answers == reference_answers([str(first), str(second)], rows=10, seed=4)[0]
    assert reference_answers(str(first), rows=100)[0] == [("math_dapo", str(i)) for i in range(30)]


def test_no_verdict_at_all_is_a_warning_that_the_watch_is_blind() -> None:
    result = judge(Measurement(unknown=20, rows=10), WatchSettings(), 64)
    assert result.status == "warning" and "no verdict on any of 10 reference answers" in result.summary


def test_a_watch_that_is_off_is_skipped(integer_data: Path) -> None:
    result = check_reward_watch(example_run(share=0), str(integer_data), compute_score)
    assert result.status == "skipped" and "off" in result.summary


def test_without_math_verify_the_check_fails(integer_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)
    result = check_reward_watch(example_run(), str(integer_data), compute_score)
    assert result.status == "failed" and "second verifier cannot run" in result.summary


def test_the_alarm_is_the_one_the_trainer_builds() -> None:
    settings, per_step = run_settings(example_run())
    assert (settings.horizon, per_step, settings.benign_rate, settings.shift) == (400, 64, 0.01, 0.10)
