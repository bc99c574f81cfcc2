"""The pairing method of bench/sandbox_compare.py: what the ratio against the fork floor is read from."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sandbox_compare


@pytest.mark.parametrize(
    ("slices", "expected"),
    [
        (1, "AB"),
        (2, "ABBA"),
        (3, "ABBAAB"),
        (4, "ABBAABBA"),
    ],
)
def test_slices_alternate_which_side_goes_first(slices: int, expected: str) -> None:
    assert "".join(sandbox_compare.slice_order("A", "B", slices)) == expected


@pytest.mark.parametrize("slices", [2, 4, 6, 8, 12])
def test_an_even_number_of_slices_cancels_a_linear_drift(slices: int) -> None:
    """Each side's slices sit at the same mean time, so a machine whose speed changes linearly over the
    pair gives both sides the same mean speed: the ratio of two equal programs is exactly 1."""
    order = sandbox_compare.slice_order("A", "B", slices)
    speed = [1.0 + 0.05 * k for k in range(len(order))]  # the machine 5 % faster every slice
    done = {"A": 0.0, "B": 0.0}
    for side, rate in zip(order, speed, strict=True):
        done[side] += rate
    assert done["A"] == pytest.approx(done["B"])


def test_one_block_each_does_not_cancel_it() -> None:
    order = sandbox_compare.slice_order("A", "B", 1)
    speed = [1.0, 1.05]
    assert speed[order.index("A")] / speed[order.index("B")] == pytest.approx(1 / 1.05)


def test_each_side_gets_its_duration_in_equal_slices_in_that_order() -> None:
    calls: list[tuple[str, float]] = []

    def measure(side: str):
        def run(seconds: float) -> dict:
            calls.append((side, seconds))
            return {"latencies": [0.01] * (10 if side == "ours" else 20), "elapsed_s": seconds, "wrong": 0}

        return run

    found = sandbox_compare.paired({"ours": measure("ours"), "floor": measure("floor")}, "floor", "ours", 6.0, 4)
    assert [side for side, _ in calls] == ["floor", "ours", "ours", "floor"] * 2
    assert all(seconds == pytest.approx(1.5) for _, seconds in calls)
    assert found["ours"]["rps"] == pytest.approx(40 / 6.0)
    assert found["floor"]["rps"] == pytest.approx(80 / 6.0)
    assert found["ours"]["slices"] == 4


def test_merged_quantiles_come_from_every_slice() -> None:
    parts = [
        {"latencies": [0.010] * 90, "elapsed_s": 1.0, "wrong": 0},
        {"latencies": [0.200] * 10, "elapsed_s": 2.0, "wrong": 1, "errors": 2, "rejected": 3, "problems": ["print: stdout '3'"]},
    ]
    merged = sandbox_compare.merge(parts)
    assert merged["requests"] == 100
    assert merged["rps"] == pytest.approx(100 / 3.0)
    assert merged["p50_ms"] == pytest.approx(10.0)
    assert merged["p99_ms"] == pytest.approx(200.0)
    assert (merged["wrong"], merged["errors"], merged["rejected"]) == (1, 2, 3)
    assert merged["problems"] == ["print: stdout '3'"]


TRIALS = 20_000


@pytest.mark.parametrize("spread", [0.03, 0.05, 0.10])
@pytest.mark.parametrize("rounds", [3, 6, 12])
def test_a_true_ratio_at_the_goal_is_declared_met_in_five_percent_of_runs(rounds: int, spread: float) -> None:
    """The verdict's error rate, by seeded simulation: rounds whose log ratio scatters normally around
    exactly the goal are declared met in 5 % of runs (within 3 Monte Carlo standard errors), whatever
    the number of rounds or the spread (the rule estimates the spread itself)."""
    rng = np.random.default_rng(35)
    logs = rng.normal(math.log(sandbox_compare.GOAL), spread, size=(TRIALS, rounds))
    met = float(np.mean(sandbox_compare.lower_bounds(logs) >= math.log(sandbox_compare.GOAL)))
    error = 3 * math.sqrt(0.05 * 0.95 / TRIALS)
    assert 0.05 - error <= met <= 0.05 + error


@pytest.mark.parametrize(
    ("true_ratio", "rounds", "spread", "at_least", "at_most"),
    [
        (0.66, 6, 0.05, 0.0, 0.001),  # below the goal: practically never met
        (0.68, 12, 0.10, 0.0, 0.02),
        (0.76, 6, 0.05, 0.80, 1.0),  # above it, with this machine's spread: met in most runs
        (0.76, 12, 0.05, 0.99, 1.0),
    ],
)
def test_how_often_the_verdict_says_met(true_ratio: float, rounds: int, spread: float, at_least: float, at_most: float) -> None:
    rng = np.random.default_rng(36)
    logs = rng.normal(math.log(true_ratio), spread, size=(TRIALS, rounds))
    met = float(np.mean(sandbox_compare.lower_bounds(logs) >= math.log(sandbox_compare.GOAL)))
    assert at_least <= met <= at_most


def test_the_verdict_pairs_ours_and_the_floor_of_each_round() -> None:
    rows = [
        {"server": "ours", "workload": "print", "concurrency": 16, "rps": 210.0, "round": 1},
        {"server": "fork-floor", "workload": "print", "concurrency": 16, "rps": 300.0, "round": 1},
        {"server": "ours", "workload": "print", "concurrency": 1, "rps": 150.0, "round": 1},
        {"server": "floor+setsid", "workload": "print", "concurrency": 16, "rps": 999.0, "round": 1},
        {"server": "fork-floor", "workload": "print", "concurrency": 16, "rps": 280.0, "round": 2},
        {"server": "ours", "workload": "print", "concurrency": 16, "rps": 224.0, "round": 2},
    ]
    assert sandbox_compare.floor_ratios(rows) == pytest.approx([0.7, 0.8])
    found = sandbox_compare.floor_verdict([0.7, 0.8])
    assert found.geomean == pytest.approx(math.sqrt(0.56))
    # two rounds: t(0.95, 1) = 6.314, the spread of two logs is |difference| / sqrt(2)
    spread = abs(math.log(0.8 / 0.7)) / math.sqrt(2)
    assert found.spread == pytest.approx(spread)
    assert found.lower == pytest.approx(math.sqrt(0.56) * math.exp(-6.3138 * spread / math.sqrt(2)), rel=1e-4)
    assert not found.met
    assert sandbox_compare.floor_verdict([0.75, 0.75, 0.75]).lower == pytest.approx(0.75)
    with pytest.raises(ValueError, match="two rounds"):
        sandbox_compare.floor_verdict([0.8])
