"""A second verifier watching the reward, and reward-hacking signals that need none (pure decisions).

Rule-based math verifiers are precise but miss correct answers, and a policy can drift toward answer
formats its reward mis-scores; the first sign is otherwise a flat AIME curve days later. So every
training step a small sample of responses (``share``, at most ``max_per_step``) is graded again by
an independent verifier - Hugging Face's math-verify, which compares answers with its own parser and
sympy, unlike the reward's (:mod:`retool.recipe.reward`) - off the training path. It grades the
answer region the reward grades (:func:`answer_region`: never interpreter output), and says
``unknown`` when it cannot read the truth or the answer; unknowns are counted apart, never as
disagreement. The disagreement rate and its direction are logged per step; the disagreeing samples
are kept as a table. Its own error rate on the reward's case table, the benign disagreement a run
shows when the reward is right, is measured in docs/recipe.md ("Second verifier: benign
disagreement rate").

Signals that need no second verifier (rates among the responses the reward scored correct):

- ``correct_without_success``: a tool run's correct answer with no successful interpreter call.
- ``answer_from_tool_output``: the graded answer is, verbatim, the last line a call printed. ReTool
  teaches exactly this (compute, then report), so read it as a trend against the run's own start.
- ``truncated_correct``: responses cut at ``maxResponseLength`` yet scored correct.
- ``several_boxed`` (on the verified sample): responses with more than one ``\\boxed`` answer.

:class:`SuspectTracker` turns each step's disagreements into the ``RewardSuspect`` signal with a
Bernoulli CUSUM (the log-likelihood-ratio CUSUM of Page, "Continuous inspection schemes", Biometrika
41, 1954, applied to binomial counts as in Reynolds & Stoumbos, "A CUSUM chart for monitoring a
proportion when inspecting continuously", J. Quality Technology 31, 1999). With ``x`` of ``n``
re-graded responses disagreeing at a step, the statistic is

    S = max(0, S_prev + x * ln(p1 / p0) + (n - x) * ln((1 - p1) / (1 - p0)))

for the benign rate ``p0`` (the second verifier's own disagreement rate on an honest reward) and
``p1 = p0 + shift`` (the rate it is built to catch). ``RewardSuspect`` is raised when ``S >= h`` and
cleared when ``S`` falls back to 0 (the excess has been paid back by benign steps).

The limit ``h = ln(horizon / false_alarm)`` bounds the false-alarm probability of the whole run:
``S_t >= h`` means that for some start ``k <= t`` the likelihood ratio of steps ``k..t`` reached
``e^h``; under a true rate ``p <= p0`` each start's ratio is a nonnegative supermartingale of mean
<= 1, so by Ville's maximal inequality it ever reaches ``e^h`` with probability <= ``e^-h``; the
union over the ``horizon`` starts gives ``P(false alarm) <= horizon * e^-h = false_alarm``. The
bound holds for every sample size per step (also a varying one, or steps with none) and every
benign rate. The detection rate and delay depend on the sample size and on how far ``p0`` sits
above the true benign rate: the statistic rises on average only above a disagreement of
``-ln((1 - p1) / (1 - p0)) / ln(p1 (1 - p0) / (p0 (1 - p1)))`` (16.6 % for ``p0`` 0.1 and ``p1``
0.25, 4.3 % for the defaults 0.01 and 0.11). :mod:`retool.recipe.reward_alarm` measures both error
rates by seeded simulation (docs/recipe.md has the table, ``tests/dynamics/test_reward_alarm.py``
checks it) and turns a measured benign rate into the ``benignRate`` to set.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from retool.recipe.reward.answer import clip_response, extract_answer, last_boxed, strip_tool_regions

WATCH_PREFIX = "reward-watch"
_BOXED = re.compile(r"\\(?:boxed|fbox|framebox)\b")


@dataclass(frozen=True)
class WatchSettings:
    """``spec.rl.rewardWatch``: how much to re-grade and when to raise ``RewardSuspect``."""

    share: float = 0.02
    max_per_step: int = 64
    benign_rate: float = 0.01
    shift: float = 0.10
    false_alarm: float = 0.01
    horizon: int = 400
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be within [0, 1], got {self.share}")
        if self.max_per_step < 0:
            raise ValueError(f"max_per_step must be >= 0, got {self.max_per_step}")
        if not 0.0 < self.benign_rate < 1.0:
            raise ValueError(f"benign_rate must be within (0, 1), got {self.benign_rate}")
        if not 0.0 < self.shift < 1.0 - self.benign_rate:
            raise ValueError(f"shift must be within (0, 1 - benign_rate = {1.0 - self.benign_rate:g}), got {self.shift}")
        if not 0.0 < self.false_alarm < 1.0:
            raise ValueError(f"false_alarm must be within (0, 1), got {self.false_alarm}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1 step, got {self.horizon}")

    @property
    def enabled(self) -> bool:
        return self.share > 0 and self.max_per_step > 0

    @property
    def alarm_limit(self) -> float:
        """``h = ln(horizon / false_alarm)``: the CUSUM level that raises ``RewardSuspect`` (module docstring)."""
        return math.log(self.horizon / self.false_alarm)

    @property
    def weights(self) -> tuple[float, float]:
        """The log-likelihood ratio of one disagreeing and of one agreeing response (p1 against p0)."""
        p0, p1 = self.benign_rate, self.benign_rate + self.shift
        return math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))


def sample_size(n: int, share: float, max_per_step: int) -> int:
    """Responses re-graded in a batch of ``n``: ``ceil(n * share)``, at most ``max_per_step``."""
    if n <= 0 or share <= 0 or max_per_step <= 0:
        return 0
    return min(n, max_per_step, math.ceil(n * share))


def sample_rows(n: int, settings: WatchSettings, step: int) -> np.ndarray:
    """Which rows to re-grade at ``step`` (sorted; reproducible for a seed and step)."""
    k = sample_size(n, settings.share, settings.max_per_step)
    rng = np.random.default_rng([settings.seed, max(step, 0)])
    return np.sort(rng.choice(n, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)


Verdict = Literal["correct", "wrong", "unknown"]
"""The second verifier's verdict; ``unknown`` (math-verify could not read the ground truth or the answer, or
failed) is left out of the disagreement rates, never counted as a disagreement."""


def answer_region(response: str) -> tuple[str, bool]:
    """The text of ``response`` the reward grades: its extracted answer, else the model's own prose.

    The reward reads only the model's own words (:func:`retool.recipe.reward.answer.extract_answer`
    cuts tool calls and interpreter output out) and grades one answer; the second verifier reads the
    same. Returns (text, True) when the reward found an answer - the verifier then only judges its
    equivalence - and (prose, False) when it found none, so math-verify's own extraction can still
    show an answer the reward missed. Interpreter output never reaches it either way.
    """
    answer = extract_answer(response)
    if answer is not None:
        return answer, True
    return strip_tool_regions(clip_response(response)), False


def _read(parsed: list[Any]) -> bool:
    """Whether math-verify read a value: ``parse`` returns [expression, text], or only the text when it could not parse it."""
    return any(not isinstance(item, str) for item in parsed)


class _NoVerdictError(Exception):
    """math-verify ran out of its time: neither correct nor wrong."""


def _off_the_main_thread(exc: Exception) -> bool:
    """math-verify's refusal to time anything outside the main thread (its SIGALRM), which it raises whatever raise_on_error says."""
    return isinstance(exc, ValueError) and "threaded environment" in str(exc)


VERIFY_STEP_TIMEOUT_S = 5
"""math-verify's default bound on one parse and one comparison (``parsing_timeout``, ``timeout_seconds``; math-verify 0.9.0)."""


def _parse(text: str, timeout_s: int) -> list[Any]:
    """math-verify's parse, with its timeout told apart from finding nothing (it returns [] for both)."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse(text, parsing_timeout=timeout_s, raise_on_error=True)
    except TimeoutException as exc:  # a BaseException in math-verify, so that its own except Exception passes it on
        raise _NoVerdictError from exc
    except Exception as exc:  # what parse answers [] for without raise_on_error
        if _off_the_main_thread(exc):
            raise
        return []


def _verify(gold: list[Any], answer: list[Any], timeout_s: int) -> bool:
    """math-verify's verify (any pair of extractions equal), a timed-out pair making the whole verdict unknown
    unless another pair is equal: without raise_on_error, verify answers False for a timeout."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    timed_out = False
    for g, t in itertools.product(gold, answer):
        try:
            if verify(g, t, timeout_seconds=timeout_s, raise_on_error=True):
                return True
        except TimeoutException:
            timed_out = True
        except Exception as exc:  # a pair that fails to compare is unequal, as in verify itself
            if _off_the_main_thread(exc):
                raise
    if timed_out:
        raise _NoVerdictError
    return False


def second_verdict(response: str, ground_truth: str, timeout_s: int = VERIFY_STEP_TIMEOUT_S) -> Verdict:
    """math-verify's verdict on the answer region the reward grades (see :func:`answer_region`).

    ``unknown`` when math-verify cannot parse the ground truth, cannot read the reward's extracted
    answer, runs out of its time (``timeout_s`` wall-clock seconds per parse and per comparison,
    math-verify's own default) or fails; ``wrong`` when neither the reward nor math-verify finds any
    answer in the model's prose. Run it in a process's main thread: math-verify bounds parsing and
    comparison with ``SIGALRM``.
    """
    if not isinstance(response, str) or not isinstance(ground_truth, str):
        return "unknown"
    truth = (last_boxed(ground_truth) or ground_truth) if "\\boxed" in ground_truth or "\\fbox" in ground_truth else ground_truth
    try:
        gold = _parse(f"${truth}$", timeout_s) or _parse(truth, timeout_s)
        if not _read(gold):
            return "unknown"
        region, extracted = answer_region(response)
        answer = _parse(f"\\boxed{{{region}}}", timeout_s) if extracted else _parse(region, timeout_s)
        if not _read(answer):
            return "unknown" if extracted else "wrong"
        return "correct" if _verify(gold, answer, timeout_s) else "wrong"
    except Exception:  # math-verify out of its time (_NoVerdictError) or failing (a sympy error): no verdict
        return "unknown"


def count_boxed(text: str) -> int:
    return len(_BOXED.findall(text or ""))


def disagreement_metrics(reward_correct: Sequence[bool], verifier_correct: Sequence[bool], prefix: str = WATCH_PREFIX) -> dict[str, float]:
    """Rates over the verified sample: disagreement, and each direction of it."""
    reward = np.asarray(reward_correct, dtype=bool)
    verifier = np.asarray(verifier_correct, dtype=bool)
    if reward.shape != verifier.shape:
        raise ValueError(f"{reward.size} reward verdicts but {verifier.size} verifier verdicts")
    metrics = {f"{prefix}/verified": float(reward.size)}
    if reward.size:
        metrics[f"{prefix}/disagreement_rate"] = float((reward != verifier).mean())
        metrics[f"{prefix}/reward_wrong_verifier_right"] = float((~reward & verifier).mean())
        metrics[f"{prefix}/reward_right_verifier_wrong"] = float((reward & ~verifier).mean())
    return metrics


def hacking_signals(
    records: Sequence[Any], correct: Sequence[bool], preds: Sequence[Any] | None, truncated: Sequence[bool], prefix: str = WATCH_PREFIX
) -> dict[str, float]:
    """Rates among correct responses of the signals listed in the module docstring (all but ``several_boxed``)."""
    correct = np.asarray(correct, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    metrics: dict[str, float] = {}
    n_correct = int(correct.sum())
    if not n_correct:
        return metrics
    recs = [r if isinstance(r, Mapping) else None for r in records]
    metrics[f"{prefix}/truncated_correct"] = float((truncated & correct).sum() / n_correct)
    tool_run = [r for r in recs if r is not None]
    if tool_run:
        no_success = np.fromiter((r is not None and "ok" not in r.get("outcomes", ()) for r in recs), dtype=bool, count=len(recs))
        metrics[f"{prefix}/correct_without_success"] = float((no_success & correct).sum() / n_correct)
        if preds is not None:
            copied = np.fromiter(
                (bool(c) and r is not None and _copied(p, r.get("outputs", ())) for r, p, c in zip(recs, preds, correct, strict=True)), dtype=bool, count=len(recs)
            )
            metrics[f"{prefix}/answer_from_tool_output"] = float(copied.sum() / n_correct)
    return metrics


def _copied(pred: Any, outputs: Sequence[str]) -> bool:
    answer = str(pred).strip() if pred is not None else ""
    return bool(answer) and any(answer == str(line).strip() for line in outputs)


class SuspectTracker:
    """The Bernoulli CUSUM of the module docstring; ``update`` says when ``RewardSuspect`` flips."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.statistic = 0.0
        self.suspect = False

    def update(self, step: int, disagreed: int, verified: int) -> str | None:
        """A message when the state changes at ``step`` ("" when cleared), else None. A step without verified samples changes nothing."""
        if verified < 0 or not 0 <= disagreed <= verified:
            raise ValueError(f"step {step}: {disagreed} disagreements among {verified} verified responses")
        if not verified:
            return None
        up, down = self.settings.weights
        self.statistic = max(0.0, self.statistic + disagreed * up + (verified - disagreed) * down)
        limit = self.settings.alarm_limit
        suspect = self.statistic >= limit if not self.suspect else self.statistic > 0.0
        if suspect == self.suspect:
            return None
        self.suspect = suspect
        if not suspect:
            return ""
        return (
            f"the second verifier's disagreement with the reward is above its benign {self.settings.benign_rate:.0%} "
            f"(CUSUM {self.statistic:.1f} >= {limit:.1f}, false-alarm probability <= {self.settings.false_alarm:g} over {self.settings.horizon} steps; "
            f"step {step}: {disagreed} of {verified} disagreed)"
        )


def simulate_first_alarm(settings: WatchSettings, rates: Sequence[float], sample: int, *, runs: int, seed: int) -> np.ndarray:
    """The step (1-based) at which :class:`SuspectTracker` first raises ``RewardSuspect`` in each of ``runs`` simulated runs, 0 if never.

    Step ``t`` has ``sample`` re-graded responses, each disagreeing with probability ``rates[t - 1]``
    (binomial draws from a seeded generator). Vectorised over runs; used to state the alarm's error
    rates (docs/recipe.md, bench/bench_reward_alarm.py) and checked against the tracker step by step.
    """
    if sample < 1 or runs < 1:
        raise ValueError(f"sample and runs must be >= 1, got {sample} and {runs}")
    rng = np.random.default_rng(seed)
    up, down = settings.weights
    limit = settings.alarm_limit
    statistic = np.zeros(runs)
    first = np.zeros(runs, dtype=np.int64)
    for step, rate in enumerate(rates, start=1):
        disagreed = rng.binomial(sample, rate, size=runs)
        statistic = np.maximum(0.0, statistic + disagreed * up + (sample - disagreed) * down)
        first[(statistic >= limit) & (first == 0)] = step
    return first
