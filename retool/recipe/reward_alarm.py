"""What the RewardSuspect alarm can see: its error rates by seeded simulation, and the benign rate to set.

The alarm (:class:`retool.recipe.reward_watch.SuspectTracker`) bounds its false alarms by
construction (``falseAlarm`` over ``rl.steps``), but its power - how often and how fast it catches a
reward that starts accepting what it should not - depends on ``benignRate``, ``shift`` and the
responses graded per step. :func:`alarm_power` measures both by seeded simulation: runs at a true
benign disagreement rate, and the same runs with the rate rising by ``+5``, ``+10``, ``+15`` points
halfway through. docs/recipe.md's alarm table is :data:`DOCUMENTED` run through it
(``python -m retool.recipe.reward_alarm`` prints it; tests/dynamics/test_reward_alarm.py fails when
the docs and the simulation part).

``benignRate`` must sit at or above the second verifier's disagreement with an honest reward on the
run's own data, or false alarms are no longer bounded; far above it, the statistic rises only for a
large disagreement (:func:`rises_above`) and a real drift goes unseen. :func:`upper_bound` and
:func:`lower_bound` are one-sided Clopper-Pearson bounds on a measured rate (each wrong with
probability at most ``1 - confidence``); :func:`recommended_benign_rate` is the upper one, never
below :data:`BENIGN_FLOOR`. The preflight measures the rate on the run's data
(:mod:`retool.preflight.reward_watch`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retool.recipe.reward_watch import WatchSettings

DRIFTS = (0.05, 0.10, 0.15)
"""Rises of the disagreement rate the table states the alarm's power for (absolute)."""
WITHIN = 20
"""Steps after a drift starts within which it counts as caught in time (the change step counts as 1)."""
RUNS = 10_000
STEPS = 400
SEED = 0
BENIGN_FLOOR = 0.01
"""The lowest benignRate recommended: the one-sided 95 % upper bound of 0 disagreements in 300
integer-answer rollouts (docs/recipe.md, "Second verifier: benign disagreement rate"). Grading the
data's reference answers against themselves shows the answer shapes of the data, not every way a
policy writes an answer, so a measurement of nearly 0 there is not taken at its word."""
CONFIDENCE = 0.95


def rises_above(settings: WatchSettings) -> float:
    """The disagreement rate above which the CUSUM's expected step is positive: below it, the alarm cannot rise on average.

    One response adds ``up`` if it disagrees and ``down`` (< 0) if not, so at a true rate ``r`` the
    expected step per response is ``r * up + (1 - r) * down``, zero at ``-down / (up - down)``
    (16.6 % for ``benignRate`` 0.1 and ``shift`` 0.15; 4.3 % for 0.01 and 0.10).
    """
    up, down = settings.weights
    return -down / (up - down)


@dataclass(frozen=True)
class AlarmPower:
    """The alarm's two error rates for one setting and true benign rate (see :func:`alarm_power`)."""

    false_alarms: float
    """Share of runs at the true benign rate that ever raise RewardSuspect over the horizon."""
    within: tuple[float, ...]
    """Per drift: share of runs that catch it within :data:`WITHIN` steps of its start."""
    caught: tuple[float, ...]
    """Per drift: share of runs that catch it before the run ends."""
    mean_delay: tuple[float | None, ...]
    """Per drift: mean steps from its start to the alarm (the start step counts as 1), over the runs that caught it; None if none did."""


def alarm_power(
    settings: WatchSettings,
    sample: int,
    true_rate: float,
    *,
    drifts: Sequence[float] = DRIFTS,
    within: int = WITHIN,
    runs: int = RUNS,
    seed: int = SEED,
) -> AlarmPower:
    """False alarms over ``settings.horizon`` steps at ``true_rate``, and the detection of each drift, by seeded simulation.

    Every step grades ``sample`` responses, each disagreeing with the true rate (binomial draws), and
    applies :class:`~retool.recipe.reward_watch.SuspectTracker`'s recursion. The benign runs go the
    whole horizon; the drifts start at step ``horizon // 2 + 1`` from each benign run's statistic at
    that step (the runs without a false alarm by then), so the delay includes whatever the benign
    steps left in the statistic. Vectorised over runs and drifts.
    """
    if sample < 1 or runs < 1 or within < 1:
        raise ValueError(f"sample, runs and within must be >= 1, got {sample}, {runs} and {within}")
    rng = np.random.default_rng(seed)
    up, down = settings.weights
    limit = settings.alarm_limit
    change = settings.horizon // 2 + 1
    statistic = np.zeros(runs)
    alarmed = np.zeros(runs, dtype=bool)
    at_change = statistic
    for step in range(1, settings.horizon + 1):
        if step == change:
            at_change = statistic[~alarmed]
        disagreed = rng.binomial(sample, true_rate, size=runs)
        statistic = np.maximum(0.0, statistic + disagreed * up + (sample - disagreed) * down)
        alarmed |= statistic >= limit
    rates = np.minimum(1.0, true_rate + np.asarray(drifts, dtype=np.float64))[:, None]
    shifted = np.repeat(at_change[None, :], len(drifts), axis=0)
    delay = np.zeros(shifted.shape, dtype=np.int64)
    for offset in range(1, settings.horizon - change + 2):
        disagreed = rng.binomial(sample, np.broadcast_to(rates, shifted.shape))
        shifted = np.maximum(0.0, shifted + disagreed * up + (sample - disagreed) * down)
        delay[(shifted >= limit) & (delay == 0)] = offset
        if delay.all():
            break
    clean = max(delay.shape[1], 1)
    caught = delay > 0
    return AlarmPower(
        false_alarms=float(alarmed.mean()),
        within=tuple(float(((d > 0) & (d <= within)).sum() / clean) for d in delay),
        caught=tuple(float(c.sum() / clean) for c in caught),
        mean_delay=tuple(float(d[d > 0].mean()) if (d > 0).any() else None for d in delay),
    )


# ------------------------------------------------------------------------------ the documented settings


@dataclass(frozen=True)
class Setting:
    """One row of docs/recipe.md's alarm table: the spec's alarm fields, the data's true benign rate, the sample graded per step."""

    benign_rate: float
    shift: float
    true_rate: float
    sample: int
    false_alarm: float = 0.01
    steps: int = STEPS

    @property
    def settings(self) -> WatchSettings:
        return WatchSettings(benign_rate=self.benign_rate, shift=self.shift, false_alarm=self.false_alarm, horizon=self.steps)


DOCUMENTED: tuple[Setting, ...] = (
    # The default on integer-answer data (measured 0 of 300), at 64 / 16 / 4 graded per step.
    Setting(0.01, 0.10, 0.0, 64),
    Setting(0.01, 0.10, 0.0, 16),
    Setting(0.01, 0.10, 0.0, 4),
    # The default with the data's true rate at the bound itself.
    Setting(0.01, 0.10, 0.01, 64),
    # Data with harder answer shapes, benignRate set to what it measures.
    Setting(0.05, 0.10, 0.05, 64),
    Setting(0.10, 0.10, 0.10, 64),
    # What an over-set benignRate costs on integer-answer data: the former default (0.1, 0.15) among them.
    Setting(0.05, 0.10, 0.0, 64),
    Setting(0.10, 0.15, 0.0, 64),
    Setting(0.10, 0.15, 0.10, 64),
    # What an under-set one costs: false alarms are no longer bounded.
    Setting(0.01, 0.10, 0.03, 64),
)


ALWAYS = 0.995
"""A drift caught by the run's end in fewer runs than this gets that share beside its mean delay."""


def _percent(value: float) -> str:
    return f"{value:.1%}"


def table_row(setting: Setting, power: AlarmPower) -> str:
    """The Markdown row docs/recipe.md holds for ``setting``."""
    cells = [
        f"{setting.benign_rate:g}",
        f"{setting.shift:g}",
        _percent(setting.true_rate),
        str(setting.sample),
        _percent(rises_above(setting.settings)),
        _percent(power.false_alarms),
    ]
    for within, caught, delay in zip(power.within, power.caught, power.mean_delay, strict=True):
        cell = f"{_percent(within)} · {'never' if delay is None else f'{delay:.1f}'}"
        cells.append(cell if delay is None or caught >= ALWAYS else f"{cell} ({_percent(caught)} ever)")
    return "| " + " | ".join(cells) + " |"


TABLE_HEADER = (
    "| `benignRate` | `shift` | true benign rate | graded per step | rises above | false alarms over 400 steps "
    "| +5 points: within 20 steps · mean delay | +10 points | +15 points |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def documented_table(*, runs: int = RUNS, seed: int = SEED) -> str:
    """docs/recipe.md's alarm table, simulated (each row with its own seed, ``seed + row``)."""
    rows = [table_row(s, alarm_power(s.settings, s.sample, s.true_rate, runs=runs, seed=seed + i)) for i, s in enumerate(DOCUMENTED)]
    return "\n".join([TABLE_HEADER, *rows])


# ------------------------------------------------------------------------------ a measured benign rate


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def upper_bound(disagreed: int, graded: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound: the true rate is above it with probability at most ``1 - confidence``.

    The ``p`` at which ``disagreed`` or fewer of ``graded`` has probability ``1 - confidence``
    (``1 - (1 - confidence) ** (1 / graded)`` for 0 disagreements: 0.99 % for 0 of 300).
    """
    _check_counts(disagreed, graded, confidence)
    if disagreed >= graded:
        return 1.0
    alpha = 1.0 - confidence
    low, high = disagreed / graded, 1.0
    for _ in range(100):  # P(X <= disagreed) falls as p rises
        middle = (low + high) / 2
        low, high = (middle, high) if _binomial_cdf(disagreed, graded, middle) > alpha else (low, middle)
    return high


def lower_bound(disagreed: int, graded: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower bound: the true rate is below it with probability at most ``1 - confidence``."""
    _check_counts(disagreed, graded, confidence)
    if disagreed == 0:
        return 0.0
    alpha = 1.0 - confidence
    low, high = 0.0, disagreed / graded
    for _ in range(100):  # P(X >= disagreed) = 1 - P(X <= disagreed - 1) rises with p
        middle = (low + high) / 2
        low, high = (middle, high) if 1.0 - _binomial_cdf(disagreed - 1, graded, middle) < alpha else (low, middle)
    return low


def _check_counts(disagreed: int, graded: int, confidence: float) -> None:
    if graded < 1 or not 0 <= disagreed <= graded:
        raise ValueError(f"{disagreed} disagreements among {graded} graded answers")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")


def recommended_benign_rate(disagreed: int, graded: int, confidence: float = CONFIDENCE) -> float:
    """The ``benignRate`` to set for a measured ``disagreed`` of ``graded``: the upper bound, rounded up to 0.001, at least :data:`BENIGN_FLOOR`."""
    return max(BENIGN_FLOOR, math.ceil(upper_bound(disagreed, graded, confidence) * 1000 - 1e-9) / 1000)


def main() -> int:
    sys.stdout.write(documented_table() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
