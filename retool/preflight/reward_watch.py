"""``reward-watch``: the second verifier's benign disagreement on the run's own data, and the ``benignRate`` it calls for.

RewardSuspect's false-alarm bound holds only while math-verify's disagreement with an honest reward
is at most ``spec.rl.rewardWatch.benignRate``; far above that rate the statistic rises only for a
large disagreement, and a reward that starts accepting false answers goes unseen (docs/recipe.md,
the alarm's table). The rate is a property of the data's answer shapes (0 of 300 on integer answers,
about 10 % on units, choice letters and sets), so it is measured where the run trains.

The measurement: a seeded sample of at most :data:`ROWS` rows of the RL files. For each, the reward
verl loads for the rl stage and the second verifier as the watch calls it
(:func:`retool.recipe.reward_watch.second_verdict`) grade two answers written in the shape the
prompts ask for (``\\boxed{}``): the row's own reference answer (right) and the next sampled row's
(wrong, unless the two are equal). The reward is honest here by construction, so each disagreement
is one the watch would count while nothing is wrong; ``unknown`` verdicts are left out, as in
training. The figure is ``x`` of ``n`` with one-sided 95 % Clopper-Pearson bounds
(:mod:`retool.recipe.reward_alarm`): the true rate on these answers is above the upper bound, or
below the lower one, with probability at most 5 % each. Reference answers in one shape are a floor
for real rollouts (a policy writes the same value in other forms), hence the recommendation never
goes below :data:`~retool.recipe.reward_alarm.BENIGN_FLOOR`.

Verdicts (the check never fails a run for its numbers; it fails only when the second verifier
cannot run at all, as the watch then could not either):

- ``warning``, under-set: the lower bound is above ``benignRate``. RewardSuspect's false-alarm bound
  does not hold; the warning gives the simulated false-alarm rate at the measured rate. When the true
  rate is at most ``benignRate`` this warning is raised in at most 5 % of measurements.
- ``warning``, over-set: ``benignRate`` is more than :data:`OVER_SET` times the recommended rate.
  The warning gives what that costs: the disagreement the statistic needs before it rises, and the
  simulated share of runs that catch a +10-point drift within 20 steps, at the spec's setting and at
  the recommended one.
- ``passed`` otherwise; ``skipped`` when the watch is off (``share`` 0) or the RL data did not load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from retool.preflight.checks import CheckResult
from retool.preflight.data import file_list
from retool.recipe.reward_alarm import WITHIN, alarm_power, lower_bound, recommended_benign_rate, rises_above, upper_bound
from retool.recipe.reward_watch import WatchSettings, sample_size, second_verdict
from retool.spec.model import RetoolRun

ROWS = 1000
"""RL rows sampled: 2 000 graded answers, a few seconds (math-verify reads a plain answer in ~2 ms)."""
SECONDS = 120.0
"""Grading stops here (math-verify may take up to 5 s on one odd answer); what was graded is the measurement."""
OVER_SET = 2.0
DRIFT = 0.10
"""The rise whose detection an over-set warning states (+10 points, the issue the defaults are set for)."""
SIMULATED_RUNS = 2000
WATCH_OFF = "spec.rl.rewardWatch is off (share or maxPerStep 0): nothing to measure"
EXAMPLES = 5

Score = Callable[..., Any]
Verdict = Callable[[str, str], str]


@dataclass(frozen=True)
class Measurement:
    """The second verifier against an honest reward on the run's reference answers."""

    disagreed: int = 0
    graded: int = 0
    unknown: int = 0
    rows: int = 0
    right: tuple[int, int] = (0, 0)
    """(disagreements, graded) among the right answers: math-verify's false rejects."""
    wrong: tuple[int, int] = (0, 0)
    """(disagreements, graded) among the wrong answers: math-verify's false accepts."""
    examples: tuple[Mapping[str, str], ...] = field(default_factory=tuple)
    stopped_early: bool = False

    @property
    def rate(self) -> float:
        return self.disagreed / self.graded if self.graded else 0.0


def reference_answers(files: Any, *, rows: int = ROWS, seed: int = 0) -> tuple[list[tuple[str, Any]], int]:
    """(data source, ground truth) of a seeded sample of at most ``rows`` rows of the RL parquet files, and how many rows they hold."""
    found: list[tuple[str, Any]] = []
    for path in file_list(files):
        table = pq.read_table(path, columns=["data_source", "reward_model"])
        for source, reward_model in zip(table.column("data_source").to_pylist(), table.column("reward_model").to_pylist(), strict=True):
            truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
            if truth is not None:
                found.append((str(source), truth))
    total = len(found)
    if total > rows:
        picked = np.sort(np.random.default_rng(seed).choice(total, size=rows, replace=False))
        found = [found[i] for i in picked]
    return found, total


def answer_text(truth: Any) -> str:
    """The reference answer as a policy would write it: the first of several truths, else the truth itself."""
    if isinstance(truth, (list, tuple, np.ndarray)):
        return str(truth[0]) if len(truth) else ""
    return str(truth)


def reward_says_right(result: Any) -> bool:
    """Right or wrong as the watch reads the reward: its ``acc`` when there is one, else a positive score."""
    if isinstance(result, Mapping):
        return float(result["acc"] if "acc" in result else result["score"]) > (0.5 if "acc" in result else 0.0)
    return float(result) > 0.0


def measure(answers: Sequence[tuple[str, Any]], score: Score, verdict: Verdict = second_verdict, *, seconds: float = SECONDS) -> Measurement:
    """Grade each row's own answer and the next row's with ``score`` (the reward) and ``verdict`` (the second verifier)."""
    started = time.monotonic()
    counts = {"right": [0, 0], "wrong": [0, 0]}
    unknown = 0
    examples: list[Mapping[str, str]] = []
    graded_rows = 0
    for index, (source, truth) in enumerate(answers):
        if time.monotonic() - started > seconds:
            return _measurement(counts, unknown, graded_rows, examples, stopped_early=True)
        graded_rows += 1
        own = answer_text(truth)
        other = answer_text(answers[(index + 1) % len(answers)][1]) if len(answers) > 1 else "preflight-not-the-answer"
        for kind, answer in (("right", own), ("wrong", other)):
            response = f"So the answer is \\boxed{{{answer}}}."
            second = verdict(response, str(truth))
            if second == "unknown":
                unknown += 1
                continue
            reward = reward_says_right(score(data_source=source, solution_str=response, ground_truth=truth, extra_info={}))
            counts[kind][1] += 1
            if reward != (second == "correct"):
                counts[kind][0] += 1
                if len(examples) < EXAMPLES:
                    examples.append({"ground_truth": str(truth)[:200], "answer": answer[:200], "reward": "right" if reward else "wrong", "second_verifier": second})
    return _measurement(counts, unknown, graded_rows, examples, stopped_early=False)


def _measurement(counts: Mapping[str, list[int]], unknown: int, rows: int, examples: list[Mapping[str, str]], *, stopped_early: bool) -> Measurement:
    right, wrong = tuple(counts["right"]), tuple(counts["wrong"])
    return Measurement(
        disagreed=right[0] + wrong[0],
        graded=right[1] + wrong[1],
        unknown=unknown,
        rows=rows,
        right=right,  # type: ignore[arg-type]
        wrong=wrong,  # type: ignore[arg-type]
        examples=tuple(examples),
        stopped_early=stopped_early,
    )


def run_settings(run: RetoolRun) -> tuple[WatchSettings, int]:
    """The alarm as the trainer builds it for ``run`` (horizon ``rl.steps``), and the responses it grades per step."""
    rl = run.spec.rl
    watch = rl.reward_watch
    settings = WatchSettings(**watch.model_dump(by_alias=False), horizon=rl.steps)  # as the rendered +retool.reward_watch.* keys build it
    return settings, sample_size(rl.batch_size * rl.rollout_n, watch.share, watch.max_per_step)


def judge(measurement: Measurement, settings: WatchSettings, per_step: int, scope: str = "rl") -> CheckResult:
    """The check's verdict on a measurement for the run's alarm (module docstring)."""
    m = measurement
    details: dict[str, Any] = {
        "rows_graded": m.rows,
        "graded": m.graded,
        "disagreed": m.disagreed,
        "unknown": m.unknown,
        "false_rejects": f"{m.right[0]} of {m.right[1]} right answers",
        "false_accepts": f"{m.wrong[0]} of {m.wrong[1]} wrong answers",
        "benign_rate": settings.benign_rate,
        "graded_per_step": per_step,
    }
    if m.examples:
        details["disagreements"] = list(m.examples)
    if not m.graded:
        summary = f"the second verifier gave no verdict on any of {m.rows} reference answers: the reward watch will see nothing on this data"
        return CheckResult("reward-watch", scope, "warning", summary, details)
    upper, lower = upper_bound(m.disagreed, m.graded), lower_bound(m.disagreed, m.graded)
    recommended = recommended_benign_rate(m.disagreed, m.graded)
    details.update(measured_rate=round(m.rate, 5), upper_bound_95=round(upper, 5), lower_bound_95=round(lower, 5), recommended_benign_rate=recommended)
    measured = (
        f"math-verify disagreed with the reward on {m.disagreed} of {m.graded} graded reference answers of the RL data "
        f"({m.rate:.1%}; at most {upper:.2%}, one-sided 95%{'; grading stopped at its time limit' if m.stopped_early else ''}"
        f"{f'; {m.unknown} answers without a verdict, which the watch cannot see' if m.unknown else ''})"
    )
    if recommended + settings.shift >= 1.0:
        summary = f"{measured}: no benignRate leaves room for spec.rl.rewardWatch.shift {settings.shift:g}; the alarm cannot work on this data"
        return CheckResult("reward-watch", scope, "warning", summary, details)
    mine = alarm_power(settings, max(per_step, 1), m.rate, drifts=(DRIFT,), runs=SIMULATED_RUNS)
    details.update(rises_above=round(rises_above(settings), 4), false_alarms_simulated=mine.false_alarms, plus_10_within_20_simulated=mine.within[0])
    if lower > settings.benign_rate:
        summary = (
            f"{measured}: spec.rl.rewardWatch.benignRate {settings.benign_rate:g} is below it, so RewardSuspect's false-alarm bound does not hold "
            f"(at {m.rate:.1%}, {mine.false_alarms:.1%} of simulated {settings.horizon}-step runs raise it); set benignRate to {recommended:g}"
        )
        return CheckResult("reward-watch", scope, "warning", summary, details)
    if settings.benign_rate > OVER_SET * recommended:
        fitting = replace(settings, benign_rate=recommended)
        better = alarm_power(fitting, max(per_step, 1), m.rate, drifts=(DRIFT,), runs=SIMULATED_RUNS)
        summary = (
            f"{measured}: spec.rl.rewardWatch.benignRate {settings.benign_rate:g} is far above it, and that costs detection: the statistic climbs on average only above "
            f"{rises_above(settings):.1%} disagreement, and a +{DRIFT * 100:.0f}-point drift is caught within {WITHIN} steps in {mine.within[0]:.1%} of simulated runs "
            f"at {per_step} graded per step (at benignRate {recommended:g} it rises above {rises_above(fitting):.1%} and catches it in {better.within[0]:.1%}); "
            f"set benignRate to {recommended:g}"
        )
        details["plus_10_within_20_at_recommended"] = better.within[0]
        return CheckResult("reward-watch", scope, "warning", summary, details)
    fits = "is at or above its upper bound" if settings.benign_rate >= recommended else "is within its bounds"
    summary = (
        f"{measured}: benignRate {settings.benign_rate:g} {fits} (recommended {recommended:g}); a +{DRIFT * 100:.0f}-point drift is caught within {WITHIN} steps "
        f"in {mine.within[0]:.1%} of simulated runs at {per_step} graded per step"
    )
    return CheckResult("reward-watch", scope, "passed", summary, details)


def check_reward_watch(run: RetoolRun, files: Any, score: Score, scope: str = "rl", *, verdict: Verdict = second_verdict, seconds: float = SECONDS) -> CheckResult:
    """``reward-watch`` on the run's RL ``files`` with the reward ``score`` verl loads (module docstring)."""
    settings, per_step = run_settings(run)
    if not settings.enabled:
        return CheckResult("reward-watch", scope, "skipped", WATCH_OFF)
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        return CheckResult("reward-watch", scope, "failed", f"the second verifier cannot run: {exc} (the trainer image installs math-verify; the reward watch needs it)")
    answers, total = reference_answers(files)
    started = time.monotonic()
    result = judge(measure(answers, score, verdict, seconds=seconds), settings, per_step, scope)
    return CheckResult(result.check, result.scope, result.status, result.summary, {**result.details, "rows_in_files": total, "seconds": round(time.monotonic() - started, 2)})


def reward_watch_check(target: Any, config: Any, blocked: str | None) -> CheckResult:
    """``reward-watch`` of the rl stage's composed ``config`` (either verl line), with the reward function verl loads from it.

    ``blocked`` is why its inputs are missing (the config, the RL data or the reward did not pass), or None.
    """
    if not run_settings(target.run)[0].enabled:
        return CheckResult("reward-watch", "rl", "skipped", WATCH_OFF)
    if blocked:
        return CheckResult("reward-watch", "rl", "skipped", blocked)
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from retool.preflight.reward import forget_loaded_reward

    forget_loaded_reward()
    try:
        score = get_custom_reward_fn(config)
        if score is None:
            return CheckResult("reward-watch", "rl", "skipped", "verl loads no custom reward function from the rl stage's config")
        return check_reward_watch(target.run, config.data.train_files, score)
    except Exception as exc:  # a finding of the run (an unreadable file, a reward that raises), never a crash of the preflight
        return CheckResult("reward-watch", "rl", "failed", f"measuring the second verifier's benign disagreement failed: {type(exc).__name__}: {exc}")
