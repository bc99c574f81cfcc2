"""Reward worst case per answer shape: every case of the reward's table timed alone, slowest first.

    .venv/bin/python bench/bench_reward_shapes.py [--repeat 5] [--top 12] [--cold 3]

Each case of ``tests/recipe_reward/cases.py`` is scored ``--repeat`` times through
``compute_score`` with the symbolic workers warm (as in training: verl's loader starts them, see
``bench/bench_reward_cold_start.py``); its figure is the slowest of those calls. A case that reaches
the symbolic stage (math-verify/sympy in a worker process) is marked: it is the only kind of answer
whose first call in a process waits for a cold start, so the slowest shapes are also scored as the
first reward of ``--cold`` fresh interpreters that never warmed the pool. Goal (issue 48): every
shape under 1 s on a quiet machine. Results in bench/RESULTS.md under "### Slowest answer shapes".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retool.recipe.reward import equivalence  # noqa: E402
from retool.recipe.reward.score import compute_score  # noqa: E402
from retool.recipe.reward.symbolic import default_pool  # noqa: E402
from tests.recipe_reward.cases import TABLE, Case  # noqa: E402

GOAL_S = 1.0

COLD = """
import json, sys, time
from retool.recipe.reward.score import compute_score
from tests.recipe_reward.cases import TABLE
case = next(c for c in TABLE if c.id == sys.argv[1])
start = time.perf_counter()
result = compute_score("dapo", case.response, case.truth)
print(json.dumps({"first_s": time.perf_counter() - start, "acc": result["acc"]}))
"""


class _CountingPool:
    """The default pool, counting the comparisons that reach it."""

    def __init__(self) -> None:
        self.pool = default_pool()
        self.calls = 0

    def __call__(self) -> _CountingPool:
        return self

    def compare(self, pred: str, truth: str, timeout_s: float) -> bool | None:
        self.calls += 1
        return self.pool.compare(pred, truth, timeout_s)


def time_case(case: Case, repeat: int, counter: _CountingPool) -> tuple[float, float, bool, bool]:
    """(slowest call s, median call s, reached the symbolic stage, verdict right) over ``repeat`` calls."""
    before = counter.calls
    times, right = [], True
    for _ in range(repeat):
        start = time.perf_counter()
        result = compute_score("dapo", case.response, case.truth)
        times.append(time.perf_counter() - start)
        right = right and result["acc"] == float(case.correct)
    return max(times), statistics.median(times), counter.calls > before, right


def cold_first_call(case_id: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", COLD, case_id], env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="calls per case (its figure is the slowest)")
    parser.add_argument("--top", type=int, default=12, help="slowest cases to print")
    parser.add_argument("--cold", type=int, default=3, help="fresh interpreters per slow shape for the cold first call (0: skip)")
    parser.add_argument("--case", action="append", default=[], help="also time this case id cold (repeatable)")
    args = parser.parse_args()

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{os.cpu_count()} CPUs, load average {' '.join(load)}; {len(TABLE)} cases x {args.repeat} calls, workers warm")
    pool = default_pool()
    pool.start()
    while pool.ready_workers() < pool.size:
        time.sleep(0.01)
    counter = _CountingPool()
    equivalence.default_pool = counter  # type: ignore[assignment]
    rows = [(case, *time_case(case, args.repeat, counter)) for case in TABLE]
    rows.sort(key=lambda row: row[1], reverse=True)
    wrong = [row[0].id for row in rows if not row[4]]
    symbolic = [row for row in rows if row[3]]
    print(f"slowest {args.top} (max / median of {args.repeat} calls; S: reaches the symbolic stage):")
    for case, worst, median, reached, _ in rows[: args.top]:
        print(f"  {worst * 1000:8.1f} ms {median * 1000:8.1f} ms  {'S' if reached else ' '}  {case.id}")
    over = [row for row in rows if row[1] >= GOAL_S]
    print(f"slowest case {rows[0][1] * 1000:.1f} ms ({rows[0][0].id}); {len(over)} of {len(rows)} at or over {GOAL_S:.0f} s")
    print(f"{len(symbolic)} of {len(rows)} cases reach the symbolic stage; wrong verdicts: {wrong or 'none'}")

    if args.cold:
        cold_ids = list(dict.fromkeys([row[0].id for row in rows[: args.top] if row[3]] + args.case))
        print(f"cold first call (a fresh interpreter, pool never warmed), {args.cold} runs each:")
        for case_id in cold_ids:
            runs = [cold_first_call(case_id) for _ in range(args.cold)]
            first = [r["first_s"] for r in runs]
            print(f"  {statistics.median(first) * 1000:8.1f} ms median, {max(first) * 1000:8.1f} ms max  {case_id}")
    with open("/proc/loadavg") as f:
        print(f"load average at the end {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
