"""RewardSuspect's Bernoulli CUSUM: hand-computed steps, and its two error rates by seeded simulation.

The figures asserted here are the ones docs/recipe.md states ("Reward watch"): at the recipe's
graded sample (64 responses per step, ``maxPerStep``) and 400 steps, a false-alarm probability
below 1 % at the benign rate, and a rise of 15 points caught within a few steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from retool.recipe.reward_watch import SuspectTracker, WatchSettings, simulate_first_alarm

STEPS = 400
RUNS = 20_000


def test_the_statistic_follows_pages_recursion_and_the_flag_clears_at_zero() -> None:
    settings = WatchSettings(benign_rate=0.1, shift=0.15, false_alarm=0.01, horizon=400)
    up, down = math.log(0.25 / 0.1), math.log(0.75 / 0.9)
    assert settings.weights == pytest.approx((up, down))
    assert settings.alarm_limit == pytest.approx(math.log(400 / 0.01))
    tracker = SuspectTracker(settings)
    expected = 0.0
    changes = []
    for step, (disagreed, verified) in enumerate([(6, 64), (0, 0), (16, 64), (17, 64), (8, 64), (6, 64), (0, 64)], start=1):
        changes.append(tracker.update(step, disagreed, verified))
        if verified:
            expected = max(0.0, expected + disagreed * up + (verified - disagreed) * down)
        assert tracker.statistic == pytest.approx(expected), step
    assert changes[:3] == [None, None, None], "6 of 64 is benign; a step without verified responses changes nothing; 16 of 64 alone is not enough"
    assert changes[3] is not None and "step 4: 17 of 64 disagreed" in changes[3] and "<= 0.01 over 400 steps" in changes[3]
    assert changes[4:6] == [None, None], "raised until the statistic is paid back to 0, not cleared by one quieter step"
    assert changes[6] == "" and tracker.statistic == 0.0


@pytest.mark.parametrize(("disagreed", "verified"), [(-1, 4), (5, 4), (1, -1)], ids=["negative count", "more disagreements than verified", "negative sample"])
def test_impossible_counts_are_refused(disagreed: int, verified: int) -> None:
    with pytest.raises(ValueError, match="disagreements among"):
        SuspectTracker(WatchSettings()).update(1, disagreed, verified)


@pytest.mark.parametrize(
    "bad",
    [{"benign_rate": 0.0}, {"benign_rate": 0.9, "shift": 0.15}, {"false_alarm": 1.0}, {"horizon": 0}, {"shift": 0.0}],
    ids=["no benign rate", "alternative above 1", "false alarm of 1", "no horizon", "no shift"],
)
def test_alarm_settings_out_of_range_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        WatchSettings(**bad)


def test_the_vectorised_simulation_is_the_tracker() -> None:
    settings = WatchSettings(benign_rate=0.05, shift=0.15, false_alarm=0.2, horizon=60)
    rates = [0.05] * 30 + [0.2] * 5
    first = simulate_first_alarm(settings, rates, 8, runs=300, seed=5)
    rng = np.random.default_rng(5)
    draws = np.stack([rng.binomial(8, rate, size=300) for rate in rates], axis=1)
    for run in range(300):
        tracker = SuspectTracker(settings)
        raised = next((step for step, x in enumerate(draws[run], start=1) if tracker.update(step, int(x), 8)), 0)
        assert first[run] == raised, run
    assert 0 < (first > 0).sum() < 300, "the comparison covers runs with and without an alarm"


@pytest.mark.parametrize("benign", [0.01, 0.05, 0.1], ids=lambda p: f"benign rate {p:.0%}")
@pytest.mark.parametrize("sample", [64, 4], ids=lambda n: f"{n} graded per step")
def test_false_alarms_over_a_whole_run_stay_below_the_bound(benign: float, sample: int) -> None:
    """Bound: 1 %. Ville's inequality makes it conservative; the simulated rate is near 0.2 %.

    Error rate of the check itself: with a true rate of 1 %, 20 000 runs exceed 1.3 % (260 alarms)
    with probability < 2e-5 (binomial tail); with the simulated ~0.2 % they never come near it.
    """
    settings = WatchSettings(benign_rate=benign, shift=0.15, false_alarm=0.01, horizon=STEPS)
    first = simulate_first_alarm(settings, [benign] * STEPS, sample, runs=RUNS, seed=11)
    assert (first > 0).mean() <= 0.01


@pytest.mark.parametrize(
    ("benign", "sample", "within", "mean_delay"),
    [(0.01, 64, 3, 1.3), (0.05, 64, 5, 2.0), (0.1, 64, 6, 2.7), (0.1, 16, 20, 8.5)],
    ids=["1% -> 16% at 64 per step", "5% -> 20% at 64 per step", "10% -> 25% at 64 per step", "10% -> 25% at 16 per step"],
)
def test_a_rise_of_fifteen_points_is_caught_within_the_stated_delay(benign: float, sample: int, within: int, mean_delay: float) -> None:
    """The rate jumps from ``benign`` to ``benign + 0.15`` at step 201; delay = steps from 201 to the alarm, inclusive.

    Asserted: >= 99 % of runs alarmed within ``within`` steps, mean delay below ``mean_delay``
    (the simulated figures sit a step or more inside these, docs/recipe.md lists them).
    """
    settings = WatchSettings(benign_rate=benign, shift=0.15, false_alarm=0.01, horizon=STEPS)
    change = 201
    first = simulate_first_alarm(settings, [benign] * (change - 1) + [benign + 0.15] * (STEPS - change + 1), sample, runs=RUNS, seed=13)
    after = first[first >= change] - change + 1
    assert (first > 0).mean() >= 0.99
    assert (after <= within).sum() / RUNS >= 0.99
    assert after.mean() < mean_delay
