"""Reward benchmark: accuracy on the reward's own table, answers scored per second, and the worst
single call on adversarial answers.

    .venv/bin/python bench/bench_reward.py [--n 20000] [--seed 0]

Through ``retool.recipe.reward.compute_score``:
- accuracy: every case of tests/recipe_reward/cases.py by category, with false accepts (a wrong
  answer scored +1) and false rejects counted apart;
- rollouts: DAPO/AIME-like responses (a few KB of reasoning with interpreter blocks, integer truths,
  ~half correct, boxed or "Answer:" lines, some with no answer) -- what RL training scores;
- symbolic: answers that only math-verify/sympy can decide (roots, polynomials, sets, pi);
- adversarial: the reward table's adversarial cases, answers built to get past the power-tower
  guard into sympy, and the inputs that made extraction quadratic before (thousands of unclosed
  ``<answer>`` tags, long natural text full of them, a multi-megabyte response), each timed alone
  (the worst one is the figure; target < 1 s);
- recovery: a comparison right after its worker (or only the worker's executor) was killed while idle.
Results are recorded in bench/RESULTS.md under "## Reward".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retool.recipe.reward.equivalence import DEFAULT_TIMEOUT_S
from retool.recipe.reward.score import compute_score
from retool.recipe.reward.symbolic import SymbolicPool, default_pool
from tests.recipe_reward import cases
from tests.recipe_reward.cases import ADVERSARIAL, SYMBOLIC

REASONING = (
    "We consider the function and apply the substitution $u = x^2$, which reduces the problem to a quadratic. "
    "By Vieta's formulas the sum of the roots is $-b/a$ and the product is $c/a$. "
)

# Past the guard on purpose: these reach sympy and must be stopped by the deadline / the kill.
PAST_THE_GUARD = [
    ("factorial of a googol power", "\\boxed{(10^{1000})!}", "3"),
    ("big binomial expansion", "\\boxed{(x+1)^{3000}}", "x^{3000}+1"),
    ("nested radicals", "\\boxed{" + "\\sqrt{2+" * 60 + "2" + "}" * 60 + "}", "2"),
    ("huge power of a symbol sum", "\\boxed{(a+b+c)^{400}}", "a^{400}"),
]


def quadratic_traps() -> list[tuple[str, str, str]]:
    """Inputs that cost 5 s to over 10 min before extraction was made linear (issue 15)."""
    paragraph = "We check the parity of the sum <answer> and continue with the next case, where the bound holds. "
    natural = paragraph * (368_000 // len(paragraph))
    return [
        ("8,000 unclosed <answer> tags", "<answer>" * 8_000, "1"),
        ("100,000 unclosed <answer> tags", "<answer>" * 100_000, "1"),
        (f"natural text with unclosed answer tags ({len(natural) // 1000} kB)", natural + "\\boxed{5}", "5"),
        ("20,000 answer statements on one line", "the answer is 1. " * 20_000 + "The final answer is 2.", "2"),
        ("a 2 MB response (only its last 1 MB is read)", REASONING * (2_000_000 // len(REASONING)) + "\\boxed{7}", "7"),
    ]


CATEGORIES = ("EXTRACTION", "TOOL_OUTPUT", "NORMALISATION", "NUMERIC", "SYMBOLIC", "ACCURACY", "GRADER_SHAPES", "EQUATIONS", "ADVERSARIAL", "WRONG")


def accuracy() -> tuple[int, int]:
    """Verdicts on the reward's own table, per category; returns (right, total)."""
    right = total = 0
    print("accuracy on the reward's case table (tests/recipe_reward/cases.py):")
    for name in CATEGORIES:
        table = getattr(cases, name)
        verdicts = [(c, compute_score("dapo", c.response, c.truth)["acc"]) for c in table]
        false_accepts = [c.id for c, acc in verdicts if acc and not c.correct]
        false_rejects = [c.id for c, acc in verdicts if c.correct and not acc]
        ok = len(table) - len(false_accepts) - len(false_rejects)
        right, total = right + ok, total + len(table)
        print(f"  {name.lower():14} {ok:3}/{len(table):<3} false accepts {len(false_accepts)}, false rejects {len(false_rejects)} {false_accepts + false_rejects or ''}")
    print(f"  all            {right}/{total} ({right / total:.1%})")
    return right, total


def recovery() -> None:
    """A comparison right after its worker died while idle: replaced and retried, never graded wrong."""
    pool = SymbolicPool(size=1)
    try:
        pool.compare("x+x", "2x", 60.0)
        for label, whole in (("executor killed while idle", False), ("whole worker killed while idle (a cold replacement)", True)):
            worker = pool._idle[0]
            pids = [worker.executor_pid, worker.proc.pid] if whole else [worker.executor_pid]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
            start = time.perf_counter()
            verdict = pool.compare("2\\sqrt{2}", "\\sqrt{8}", 60.0)
            print(f"  {(time.perf_counter() - start) * 1000:8.1f} ms  result={verdict!s:5}  a comparison right after its {label}")
    finally:
        pool.close()


def make_rollout(rng: random.Random, scale: int = 1) -> tuple[str, str]:
    truth = str(rng.randint(0, 999))
    parts = [REASONING * rng.randint(2, 12) * scale]
    for _ in range(rng.randint(0, 4)):
        value = rng.randint(0, 10**6)
        parts.append(f"<code>\n```python\nx = {value}\nprint(x % 1000)\n```\n</code>\n<interpreter>\n{value % 1000}\n\\boxed{{{value}}}\n</interpreter>\n")
        parts.append(REASONING)
    kind = rng.random()
    answer = truth if rng.random() < 0.5 else str(int(truth) + rng.randint(1, 50))
    if kind < 0.6:
        parts.append(f"Therefore the answer is $\\boxed{{{answer}}}$.")
    elif kind < 0.8:
        parts.append(f"Answer: {answer}")
    elif kind < 0.9:
        parts.append(f"\\boxed{{{answer}.0}}")
    else:
        parts.append("I could not finish.")
    return "".join(parts), truth


def throughput(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    start = time.perf_counter()
    correct = sum(compute_score("dapo", response, truth)["acc"] for response, truth in pairs)
    elapsed = time.perf_counter() - start
    return len(pairs) / elapsed, correct / len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="rollout responses to score")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; symbolic timeout {DEFAULT_TIMEOUT_S} s")
    cold = time.perf_counter()
    compute_score("dapo", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}")
    print(f"cold start (first symbolic call, worker imports sympy+math-verify): {time.perf_counter() - cold:.2f} s")
    accuracy()

    rollouts = [make_rollout(rng) for _ in range(args.n)]
    mean_chars = statistics.mean(len(r) for r, _ in rollouts)
    rate, acc = throughput(rollouts)
    print(f"rollouts: {args.n} responses of {mean_chars:.0f} chars on average: {rate:,.0f} answers/s (accuracy {acc:.2f})")

    long_rollouts = [make_rollout(rng, scale=40) for _ in range(max(args.n // 10, 1))]
    mean_chars = statistics.mean(len(r) for r, _ in long_rollouts)
    rate, _ = throughput(long_rollouts)
    print(f"long rollouts: {len(long_rollouts)} responses of {mean_chars:.0f} chars on average: {rate:,.0f} answers/s")

    symbolic = [(c.response, c.truth) for c in SYMBOLIC] * 10
    rate, _ = throughput(symbolic)
    print(f"symbolic: {len(symbolic)} answers decided by math-verify/sympy: {rate:,.0f} answers/s")

    pool = default_pool()
    kills_before = pool.kills
    rows = [(c.id, c.response, c.truth) for c in ADVERSARIAL] + PAST_THE_GUARD + quadratic_traps()
    worst = ("", 0.0)
    print("adversarial (one call each):")
    for name, response, truth in rows:
        start = time.perf_counter()
        result = compute_score("dapo", response, truth)
        elapsed = time.perf_counter() - start
        worst = max(worst, (name, elapsed), key=lambda x: x[1])
        print(f"  {elapsed * 1000:8.1f} ms  acc={result['acc']!s:5}  {name}")
    # The guard keeps towers away from sympy; sent straight to a worker, one runs CPython's big-integer
    # power for minutes. CPython checks signals between its squarings, so the executor's own timer
    # ends it (until 2026-11-28 math-verify swallowed the timer's exception and the kill ended it);
    # a single squaring late in the power would outlast the timer, and then the kill ends it.
    for label in ("tower sent straight to a worker (guard bypassed)", "the same again"):
        start = time.perf_counter()
        verdict = pool.compare("9^{9^{9^9}}", "5", DEFAULT_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        worst = max(worst, (label, elapsed), key=lambda x: x[1])
        print(f"  {elapsed * 1000:8.1f} ms  result={verdict!s:5}  {label}")
    start = time.perf_counter()
    compute_score("dapo", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}")
    print(f"  {(time.perf_counter() - start) * 1000:8.1f} ms  a normal symbolic call right after the two towers")
    print(f"worst single call: {worst[1] * 1000:.0f} ms ({worst[0]}); workers killed at the deadline: {pool.kills - kills_before}")
    print("recovery (a pool of one worker of its own):")
    recovery()


if __name__ == "__main__":
    main()
