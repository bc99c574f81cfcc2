"""Eval metrics: retool.recipe.metrics against verl 0.6.1's own process_validation_metrics.

Same inputs, same outputs (asserted), time of each. AIME-sized by default: 2 sources x 30
problems x 30 samples; ``--problems``/``--samples`` scale it (e.g. a 1000-problem RL validation).

    .venv/bin/python bench/metrics_bench.py [--problems 30] [--samples 30]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from retool.recipe.metrics import process_validation_metrics


def samples(problems: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sources, uids, acc, preds = [], [], [], []
    for p in range(problems):
        skill = rng.random()
        for _ in range(n):
            sources.append("aime_2024" if p % 2 else "aime_2025")
            uids.append(f"p{p}")
            acc.append(float(rng.random() < skill))
            preds.append(str(rng.integers(0, 5)))
    return sources, uids, {"reward": [2 * a - 1 for a in acc], "acc": acc, "pred": preds}


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=60)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    from verl.trainer.ppo.metric_utils import process_validation_metrics as verl_metrics

    data = samples(args.problems, args.samples)
    ours, ours_s = timed(process_validation_metrics, *data)
    theirs, verl_s = timed(verl_metrics, *data)
    identical = {d: {v: dict(m) for v, m in vs.items()} for d, vs in theirs.items()} == ours
    print(f"{args.problems} problems x {args.samples} samples: retool {ours_s:.3f} s, verl {verl_s:.3f} s, speed-up {verl_s / ours_s:.1f}x, identical={identical}")


if __name__ == "__main__":
    main()
