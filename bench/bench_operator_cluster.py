"""The operator benchmark (bench_operator.py) against the real control plane instead of kmock's emulator.

Starts the end-to-end control plane (upstream/cluster.py: etcd, kube-apiserver, controller manager,
scheduler, kwok, KubeRay, Kueue), installs the RetoolRun CRD, starts ``python -m retool_operator``
(cluster-wide, parent MLflow runs off, the admin kubeconfig), creates N RetoolRuns with one
``kubectl create`` and reports the time until every run has its sandbox Deployment and its first stage
(the prepare Job), the operator's CPU time and peak resident memory.

    .venv/bin/python bench/bench_operator_cluster.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from bench.bench_operator import cpu_seconds, peak_rss_mib  # noqa: E402
from tests.conftest import free_port, repo_env  # noqa: E402
from tests.e2e.conftest import apply_claim, run_manifest  # noqa: E402
from upstream import cluster  # noqa: E402

NS = "bench"


def count(plane: cluster.ControlPlane, kind: str, suffix: str) -> int:
    items = json.loads(plane.kubectl("get", kind, "-n", NS, "-o", "json", timeout=120).stdout)["items"]
    return sum(1 for i in items if i["metadata"]["name"].endswith(suffix))


def main(runs: int, timeout: float) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    with cluster.running(workdir, log=print) as plane:
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "charts/retool/crds"))
        plane.kubectl("wait", "--for=condition=Established", "crd/retoolruns.retool.dev")
        plane.kubectl("create", "namespace", NS)
        apply_claim(plane, NS)
        liveness = free_port()
        env = repo_env(KUBECONFIG=str(plane.kubeconfig), RETOOL_OPERATOR_LIVENESS_PORT=str(liveness), RETOOL_OPERATOR_BIND_ADDRESS="127.0.0.1",
                       RETOOL_OPERATOR_MLFLOW_PARENT_RUNS="false", RETOOL_OPERATOR_RESYNC_SECONDS="3600")
        log = (workdir / "operator.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "retool_operator"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2).status == 200:
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.3)
            idle_rss, cpu0 = peak_rss_mib(proc.pid), cpu_seconds(proc.pid)
            docs = [run_manifest(f"run-{i:03d}", NS) for i in range(runs)]
            started = time.monotonic()
            plane.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}), timeout=600)
            created = time.monotonic() - started
            while True:
                jobs, sandboxes = count(plane, "jobs", "-prepare-1"), count(plane, "deployments", "-sandbox")
                if jobs >= runs and sandboxes >= runs:
                    break
                if time.monotonic() - started > timeout:
                    raise SystemExit(f"timed out: {jobs} prepare Jobs, {sandboxes} sandboxes of {runs}")
                time.sleep(1)
            elapsed = time.monotonic() - started
            print(f"{runs} runs created by kubectl in {created:.1f} s; all have sandbox + first stage after {elapsed:.1f} s "
                  f"({runs / elapsed:.1f} runs/s); operator CPU {cpu_seconds(proc.pid) - cpu0:.1f} s "
                  f"({(cpu_seconds(proc.pid) - cpu0) / runs * 1000:.0f} ms/run); peak RSS {peak_rss_mib(proc.pid):.0f} MiB (idle {idle_rss:.0f})")
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    main(args.runs, args.timeout)
