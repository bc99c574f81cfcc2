"""Benchmark: how long the first reward in a fresh trainer process waits for the symbolic workers.

    .venv/bin/python bench/bench_reward_cold_start.py [--repeat 3] [--workers 2]

Each scenario runs in a fresh interpreter, as a reward manager does, and scores one answer that
only the symbolic stage decides (``\\boxed{2\\sqrt{2}}`` against ``\\sqrt{8}``):

- cold: ``compute_score`` called with no warm-up (the behaviour before issue 29: the first call
  starts the workers and waits for their imports);
- warmed: verl 0.6.1's own loader (``get_custom_reward_fn``) loads the entry file
  ``retool/recipe/verl_plugins/reward.py`` -- the reward manager's start, which starts the workers --
  then the first rollout arrives once they are ready; the figure is the first reward's latency, and
  the warm-up's duration (what the first rollout's generation must outlast; a 16k-token vLLM rollout
  takes minutes);
- immediate: the worst case, a reward requested right after the load, before the warm-up ended.

Goal: the first reward after the warm-up under 1 s. Results in bench/RESULTS.md under
"## Reward cold start".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_FILE = REPO / "retool" / "recipe" / "verl_plugins" / "reward.py"

SCENARIO = textwrap.dedent(
    """
    import json, sys, time
    scenario, entry = sys.argv[1], sys.argv[2]
    started = time.perf_counter()
    if scenario == "cold":
        from retool.recipe.reward.score import compute_score
        warm_s = 0.0
    else:
        from omegaconf import OmegaConf
        from verl.trainer.ppo.reward import get_custom_reward_fn
        from retool.recipe.reward.symbolic import default_pool
        compute_score = get_custom_reward_fn(OmegaConf.create({"custom_reward_function": {"path": entry, "name": "compute_score"}}))
        pool = default_pool()
        if scenario == "warmed":
            while pool.ready_workers() < pool.size:
                time.sleep(0.01)
        warm_s = time.perf_counter() - started
    t0 = time.perf_counter()
    result = compute_score("aime", "so \\\\boxed{2\\\\sqrt{2}}", "\\\\sqrt{8}")
    first_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    compute_score("aime", "so \\\\boxed{x^2+2x+1}", "(x+1)^2")
    second_s = time.perf_counter() - t1
    print(json.dumps({"warm_s": warm_s, "first_s": first_s, "second_s": second_s, "acc": result["acc"]}))
    """
)


def run(scenario: str, workers: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "RETOOL_SYMBOLIC_WORKERS": str(workers)}
    proc = subprocess.run([sys.executable, "-c", SCENARIO, scenario, str(ENTRY_FILE)], env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, {args.workers} symbolic workers, {args.repeat} fresh processes per scenario")
    for scenario in ("cold", "warmed", "immediate"):
        runs = [run(scenario, args.workers) for _ in range(args.repeat)]
        assert all(r["acc"] == 1.0 for r in runs), runs
        first = [r["first_s"] for r in runs]
        warm = [r["warm_s"] for r in runs]
        second = [r["second_s"] for r in runs]
        print(
            f"{scenario:>9}: first reward median {statistics.median(first):.3f} s (max {max(first):.3f} s), "
            f"second {statistics.median(second):.3f} s; {statistics.median(warm):.2f} s from process start to the request (max {max(warm):.2f} s)"
        )


if __name__ == "__main__":
    main()
