"""200 RetoolRuns created at once against kmock's Kubernetes emulator.

Starts the emulator in this process and the real operator as a subprocess
(``python -m retool_operator``), creates N RetoolRuns concurrently, and reports the time until
every run has its sandbox Deployment and its first stage (the prepare Job), the operator's peak
resident memory (VmHWM), and how many API requests the operator made.

    .venv/bin/python bench/bench_operator.py [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import kmock  # noqa: E402

from tests.conftest import free_port, repo_env  # noqa: E402
from tests.operator.emulator import DEPLOYMENTS, JOBS, TEST_AGENT, ObserverClient, ScalableEmulator, credentials_for, declare, operator_requests, write_kubeconfig  # noqa: E402
from tests.operator.helpers import document  # noqa: E402

NS = "bench"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (separates the operator's cost from the emulator's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main(runs: int, timeout: float) -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(server.url))
        env = repo_env(
            KUBECONFIG=str(kubeconfig),
            RETOOL_OPERATOR_LIVENESS_PORT=str(free_port()),
            RETOOL_OPERATOR_BIND_ADDRESS="127.0.0.1",
            RETOOL_OPERATOR_MLFLOW_PARENT_RUNS="false",
            RETOOL_OPERATOR_RESYNC_SECONDS="3600",
        )
        log = open(Path(tempfile.mkdtemp()) / "operator.log", "w")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "retool_operator"], env=env, stdout=log, stderr=subprocess.STDOUT)
        api = ObserverClient(credentials_for(str(server.url)))
        try:
            # Wait until the operator is watching (it lists RetoolRuns first).
            while not any(r.resource is not None and r.resource.plural == "retoolruns" for r in k8s.requests if r.headers.get("User-Agent") != TEST_AGENT):
                if proc.poll() is not None:
                    raise SystemExit(f"operator exited with {proc.returncode}; see {log.name}")
                await asyncio.sleep(0.05)
            idle_rss = peak_rss_mib(proc.pid)
            # The claim every run names (helpers.document): the operator checks it before the first stage.
            claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "retool-data", "namespace": NS}}
            await api.create({**claim, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}}})
            docs = []
            for i in range(runs):
                doc = document(name=f"run-{i:04d}", namespace=NS, uid=f"uid-{i:04d}")
                doc["metadata"]["resourceVersion"] = "1"
                docs.append(doc)
            cpu_before = cpu_seconds(proc.pid)
            start = time.monotonic()
            await asyncio.gather(*(api.create(d) for d in docs))
            created = time.monotonic() - start
            done_at = None
            cpu_used = float("nan")
            while time.monotonic() - start < timeout:
                deployments = {o["metadata"]["name"] for o in await api.list(DEPLOYMENTS, NS)}
                jobs = {o["metadata"]["name"] for o in await api.list(JOBS, NS)}
                ready = sum(1 for d in docs if f"{d['metadata']['name']}-sandbox" in deployments and f"{d['metadata']['name']}-prepare-1" in jobs)
                if ready == runs:
                    done_at = time.monotonic() - start
                    cpu_used = cpu_seconds(proc.pid) - cpu_before
                    break
                await asyncio.sleep(0.2)
            # Let the status writes settle, then read the peak.
            await asyncio.sleep(2)
            peak = peak_rss_mib(proc.pid)
            requests = operator_requests(k8s)
        finally:
            await api.close()
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    print(f"runs: {runs}")
    print(f"create requests sent in: {created:.2f} s")
    if done_at is None:
        print(f"NOT DONE within {timeout:.0f} s: {ready}/{runs} runs have their sandbox and first stage")
    else:
        print(f"every run has its sandbox Deployment and prepare Job after: {done_at:.2f} s ({runs / done_at:.1f} runs/s)")
    print(f"operator CPU time until then: {cpu_used:.1f} s ({1000 * cpu_used / runs:.0f} ms per run)")
    print(f"operator peak RSS: {peak:.0f} MiB (idle after start: {idle_rss:.0f} MiB)")
    print(f"operator API requests: {len(requests)} ({len(requests) / runs:.1f} per run)")
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.timeout))
