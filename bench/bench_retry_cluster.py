"""Time from a failed attempt to the next attempt's running driver, on a fresh Ray cluster and on the same one.

Runs ``tests/e2e/retry_timing.py`` on the end-to-end control plane (etcd, kube-apiserver, the controllers,
kube-scheduler, kwok nodes, KubeRay 1.6.1, Kueue; a real Ray head answers as the dashboard): per round, a run
whose sft job fails in Ray retries with ``backoffSeconds: 0`` once each way, and the time from KubeRay marking
attempt 1 Failed to attempt 2's submitter pod running is taken by polling the API server every 50 ms (each
figure may be up to one kubectl call, ~0.1-0.3 s, late). kwok starts pods at once, with no image pull, no Ray
start and no queue: the figures are the control plane's share only, and a real cluster adds those to every
fresh cluster.

    .venv/bin/python bench/bench_retry_cluster.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "RETOOL_BENCH_OUT": str(out), "RETOOL_BENCH_ROUNDS": str(args.rounds)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/retry_timing.py"], cwd=REPO, env=env, check=False)
        if done.returncode != 0 or not out.exists():
            sys.exit(f"the timing scenario failed (exit {done.returncode})")
        figures = json.loads(out.read_text())
    print(f"load average at start: {load:.2f} ({os.cpu_count()} CPUs)")
    print(f"{'way':<15} {'rounds':>6} {'median s':>9} {'min s':>7} {'max s':>7}")
    for way in ("fresh cluster", "same cluster"):
        seconds = [f["seconds"] for f in figures if f["way"] == way]
        print(f"{way:<15} {len(seconds):>6} {statistics.median(seconds):>9.2f} {min(seconds):>7.2f} {max(seconds):>7.2f}")


if __name__ == "__main__":
    main()
