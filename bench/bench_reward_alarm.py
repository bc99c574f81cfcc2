"""Error rates of the RewardSuspect alarm (the Bernoulli CUSUM of ``retool.recipe.reward_watch``) by seeded simulation.

For each benign rate and graded sample per step: the share of 400-step runs at the benign rate that
ever raise the alarm (false alarms; bounded by ``falseAlarm`` = 1 %), and, for runs whose rate rises
by 15 points at step 201, the share caught by step 400, the mean delay and the delay 99 % of runs
stay within (steps counted from 201, inclusive). Prints a Markdown table (docs/recipe.md).

    python bench/bench_reward_alarm.py [--runs 20000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from retool.recipe.reward_watch import WatchSettings, simulate_first_alarm

STEPS = 400
CHANGE = 201
SHIFT = 0.15


def row(benign: float, sample: int, runs: int, seed: int) -> str:
    settings = WatchSettings(benign_rate=benign, shift=SHIFT, false_alarm=0.01, horizon=STEPS)
    benign_runs = simulate_first_alarm(settings, [benign] * STEPS, sample, runs=runs, seed=seed)
    shifted = simulate_first_alarm(settings, [benign] * (CHANGE - 1) + [benign + SHIFT] * (STEPS - CHANGE + 1), sample, runs=runs, seed=seed + 1)
    delays = shifted[shifted >= CHANGE] - CHANGE + 1
    return (
        f"| {benign:.0%} | {sample} | {(benign_runs > 0).mean():.2%} | {(shifted >= CHANGE).mean():.2%} "
        f"| {delays.mean():.1f} steps | {int(np.percentile(delays, 99))} steps |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    lines = [row(benign, sample, args.runs, args.seed + 10 * i) for i, (benign, sample) in enumerate((b, n) for b in (0.01, 0.05, 0.1) for n in (64, 16, 4))]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
