"""The pairing method of bench/sandbox_compare.py: what the ratio against the fork floor is read from."""

from __future__ import annotations

import sys
from pathlib import Path

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
