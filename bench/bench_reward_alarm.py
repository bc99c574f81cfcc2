"""Error rates and detection power of the RewardSuspect alarm (the Bernoulli CUSUM of ``retool.recipe.reward_watch``).

One simulator and one table, kept in ``retool.recipe.reward_alarm`` (its ``documented_table`` is what
docs/recipe.md prints and tests/dynamics/test_reward_alarm.py compares cell by cell); this prints that
table, optionally with more runs or another seed, and how long it took.

    python bench/bench_reward_alarm.py [--runs 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from retool.recipe.reward_alarm import RUNS, SEED, documented_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="simulated runs per row")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    started, load = time.perf_counter(), os.getloadavg()[0]
    table = documented_table(runs=args.runs, seed=args.seed)
    sys.stdout.write(f"{table}\n\n{args.runs} runs per row, seed {args.seed}: {time.perf_counter() - started:.1f} s (load average {load:.2f} at the start)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
