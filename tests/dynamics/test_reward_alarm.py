"""RewardSuspect's Bernoulli CUSUM: hand-computed steps, and its two error rates by seeded simulation.

docs/recipe.md's alarm table ("Reward watch") is simulated here again and compared cell by cell
(:mod:`retool.recipe.reward_alarm`); the example's defaults are held to what issue 48 asks: at the
benign rate of its integer-answer data, a +10-point drift caught within 20 steps in >= 95 % of runs,
with <= 1 % false alarms over the run. The one-sided bounds the preflight states on a measured
benign rate are checked for their coverage by simulation too.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from retool.recipe.reward_alarm import (
    BENIGN_FLOOR,
    DOCUMENTED,
    DRIFTS,
    TABLE_HEADER,
    WITHIN,
    AlarmPower,
    Setting,
    alarm_power,
    lower_bound,
    recommended_benign_rate,
    rises_above,
    upper_bound,
)
from retool.recipe.reward_watch import SuspectTracker, WatchSettings, sample_size, simulate_first_alarm
from retool.spec.validate import parse_run

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


# ------------------------------------------------------------------------------ power: docs/recipe.md's table

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "recipe.md"
EXAMPLE = REPO / "examples" / "retoolrun-qwen32b-h200.yaml"
CELL = re.compile(r"^(?P<within>[\d.]+)% · (?:never|(?P<delay>[\d.]+)(?: \((?P<ever>[\d.]+)% ever\))?)$")


def documented_rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    header = TABLE_HEADER.splitlines()[0]
    assert header in text, "docs/recipe.md holds the alarm table under the header reward_alarm.TABLE_HEADER writes"
    rows = []
    for line in text[text.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.fixture(scope="module")
def simulated() -> list[AlarmPower]:
    """The documented settings, simulated as ``python -m retool.recipe.reward_alarm`` does (each row seeded with its index)."""
    return [alarm_power(s.settings, s.sample, s.true_rate, seed=i) for i, s in enumerate(DOCUMENTED)]


def test_the_docs_alarm_table_is_the_simulation(simulated: list[AlarmPower]) -> None:
    """Every cell of the docs' table against a fresh simulation: settings exactly, rates within 1 point, delays within 5 % (0.3 steps at least).

    The same seed gives the same figures; the margins only absorb a numpy whose binomial stream differs
    (10 000 runs: a rate's standard error is at most 0.5 point).
    """
    rows = documented_rows()
    assert len(rows) == len(DOCUMENTED), "one docs row per documented setting"
    for row, setting, power in zip(rows, DOCUMENTED, simulated, strict=True):
        where = f"docs row {row}"
        assert row[:5] == [f"{setting.benign_rate:g}", f"{setting.shift:g}", f"{setting.true_rate:.1%}", str(setting.sample), f"{rises_above(setting.settings):.1%}"], where
        assert float(row[5].rstrip("%")) == pytest.approx(100 * power.false_alarms, abs=1.0), where
        for cell, within, caught, delay in zip(row[6:], power.within, power.caught, power.mean_delay, strict=True):
            found = CELL.match(cell)
            assert found, f"{where}: {cell!r}"
            assert float(found["within"]) == pytest.approx(100 * within, abs=1.0), where
            if delay is None:
                assert found["delay"] is None, where
                continue
            assert float(found["delay"]) == pytest.approx(delay, abs=max(0.3, 0.05 * delay)), where
            if found["ever"] is not None:
                assert float(found["ever"]) == pytest.approx(100 * caught, abs=1.0), where


def test_the_examples_default_catches_a_ten_point_drift_within_twenty_steps_with_few_false_alarms() -> None:
    """Issue 48's bar, at the example's own graded sample and steps: >= 95 % within 20 steps, <= 1 % false alarms.

    At its data's benign rate (0 of 300 on integer answers) and at the default's own bound (1 %).
    With 10 000 runs a true 95 % (1 %) shows above 95.6 % (below 0.8 %) with probability < 0.1 %.
    """
    run = parse_run(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))
    rl, watch = run.spec.rl, run.spec.rl.reward_watch
    settings = WatchSettings(**watch.model_dump(by_alias=False), horizon=rl.steps)
    per_step = sample_size(rl.batch_size * rl.rollout_n, watch.share, watch.max_per_step)
    assert (settings.benign_rate, settings.shift, per_step, rl.steps) == (0.01, 0.10, 64, 400), "the example runs the defaults the docs justify"
    ten = DRIFTS.index(0.10)
    for true_rate in (0.0, settings.benign_rate):
        power = alarm_power(settings, per_step, true_rate, seed=7)
        assert power.within[ten] >= 0.95, (true_rate, power)
        assert power.false_alarms <= 0.01, (true_rate, power)


def test_the_former_default_was_blind_to_a_ten_point_drift_on_integer_answer_data() -> None:
    """benignRate 0.1 and shift 0.15 rise only past 16.6 %: a drift from 0 to 10 % is (almost) never caught."""
    former = WatchSettings(benign_rate=0.1, shift=0.15, horizon=400)
    assert rises_above(former) == pytest.approx(0.166, abs=0.001)
    power = alarm_power(former, 64, 0.0, drifts=(0.10,), runs=4000, seed=3)
    assert power.within[0] < 0.01 and power.caught[0] < 0.01


@pytest.mark.parametrize(("true_rate", "raised", "in_time"), [(0.12, 0.15, 0.05), (0.20, 0.99, 0.95)], ids=["4.6 points below rises_above", "3.4 points above it"])
def test_below_rises_above_only_chance_raises_the_alarm_and_above_it_the_statistic_climbs(true_rate: float, raised: float, in_time: float) -> None:
    """The former defaults (rises above 16.6 %), 64 per step, the rate constant from step 1 over 400 steps.

    Below: raised by step 400 in fewer than ``raised`` of the runs (simulated 8 %) and within 20 steps in
    fewer than ``in_time`` (0.4 %); above: raised within 20 steps in more than ``in_time`` (99.8 %).
    2 000 runs: each margin is more than 4 standard errors from the simulated figure.
    """
    settings = WatchSettings(benign_rate=0.1, shift=0.15, horizon=400)
    first = simulate_first_alarm(settings, [true_rate] * 400, 64, runs=2000, seed=5)
    within = ((first > 0) & (first <= WITHIN)).mean()
    if true_rate < rises_above(settings):
        assert (first > 0).mean() < raised and within < in_time
    else:
        assert (first > 0).mean() > raised and within > in_time


def test_a_drift_is_counted_from_its_first_step() -> None:
    """Every response disagreeing from the change on: the delay is exactly the steps the limit needs, ceil(h / (n up))."""
    settings = WatchSettings(horizon=40)
    up, _ = settings.weights
    power = alarm_power(settings, 4, 0.0, drifts=(1.0,), runs=50, seed=1)
    assert power == AlarmPower(false_alarms=0.0, within=(1.0,), caught=(1.0,), mean_delay=(float(math.ceil(settings.alarm_limit / (4 * up))),))


def test_the_false_alarms_are_those_of_the_tracker() -> None:
    """alarm_power's benign runs draw as simulate_first_alarm does (itself checked against SuspectTracker above)."""
    settings = WatchSettings(benign_rate=0.05, shift=0.10, false_alarm=0.3, horizon=60)
    first = simulate_first_alarm(settings, [0.05] * 60, 8, runs=3000, seed=9)
    assert alarm_power(settings, 8, 0.05, runs=3000, seed=9).false_alarms == (first > 0).mean() > 0


def test_the_default_is_the_documented_row_the_docs_justify_it_with() -> None:
    default = WatchSettings()
    assert DOCUMENTED[0] == Setting(default.benign_rate, default.shift, 0.0, 64) and default.benign_rate == BENIGN_FLOOR
    assert default.benign_rate == recommended_benign_rate(0, 300), "0.01 is the 95 % upper bound of 0 disagreements in 300 rollouts, rounded up"
    assert WITHIN == 20


# ------------------------------------------------------------------------------ a measured benign rate: bounds and recommendation


@pytest.mark.parametrize(("disagreed", "graded", "upper"), [(0, 300, 1 - 0.05 ** (1 / 300)), (0, 1000, 1 - 0.05 ** (1 / 1000)), (300, 300, 1.0)], ids=str)
def test_the_upper_bound_of_no_disagreement_is_the_closed_form(disagreed: int, graded: int, upper: float) -> None:
    assert upper_bound(disagreed, graded) == pytest.approx(upper, rel=1e-6)


@pytest.mark.parametrize("rate", [0.003, 0.02, 0.1], ids=lambda p: f"true rate {p:.1%}")
@pytest.mark.parametrize("graded", [300, 2000], ids=lambda n: f"{n} graded")
def test_the_bounds_are_wrong_in_at_most_five_percent_of_measurements(rate: float, graded: int) -> None:
    """Coverage by seeded simulation: 20 000 measurements of ``graded`` answers at ``rate``.

    Clopper-Pearson bounds are conservative (each misses in <= 5 %); the check's own error: a true 5 %
    shows above 5.5 % in 20 000 draws with probability < 0.1 %.
    """
    counts = np.random.default_rng(17).binomial(graded, rate, size=20_000)
    values = np.unique(counts)
    uppers = dict(zip(values, (upper_bound(int(x), graded) for x in values), strict=True))
    lowers = dict(zip(values, (lower_bound(int(x), graded) for x in values), strict=True))
    assert np.mean([uppers[x] < rate for x in counts]) <= 0.055
    assert np.mean([lowers[x] > rate for x in counts]) <= 0.055


@pytest.mark.parametrize(
    ("disagreed", "graded", "recommended"),
    [(0, 300, 0.01), (0, 5000, BENIGN_FLOOR), (3, 300, 0.026), (30, 300, 0.134)],
    ids=["none in 300", "none in 5000: the floor", "1 % measured", "10 % measured"],
)
def test_the_recommended_benign_rate_is_the_upper_bound_rounded_up_never_below_the_floor(disagreed: int, graded: int, recommended: float) -> None:
    assert recommended_benign_rate(disagreed, graded) == recommended
    assert recommended_benign_rate(disagreed, graded) >= upper_bound(disagreed, graded)


@pytest.mark.parametrize(("disagreed", "graded"), [(-1, 10), (11, 10), (0, 0)], ids=["negative", "more than graded", "nothing graded"])
def test_impossible_measurements_are_refused(disagreed: int, graded: int) -> None:
    with pytest.raises(ValueError, match="disagreements among"):
        upper_bound(disagreed, graded)
