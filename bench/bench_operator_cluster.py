"""The operator benchmark (bench_operator.py) against the real control plane instead of kmock's emulator.

Starts the end-to-end control plane (upstream/cluster.py: etcd, kube-apiserver, controller manager,
scheduler, kwok, KubeRay, Kueue), installs the RetoolRun CRD, starts ``python -m retool_operator``
(cluster-wide, parent MLflow runs off), creates N RetoolRuns with one ``kubectl create`` and reports the
time until every run has its sandbox Deployment and its first stage (the prepare Job), then until every
run's status names that stage (converged), the operator's CPU time and peak resident memory, the API
server's CPU time over the same window, and the API requests the operator made per run.

The operator runs as a ServiceAccount (cluster-admin) whose requests a FlowSchema of its own sends to
the ``workload-low`` priority level, where a ServiceAccount's requests go by default (the
``service-accounts`` FlowSchema): the same treatment, but kube-apiserver's
``apiserver_flowcontrol_dispatched_requests_total{flow_schema="retool-bench-operator"}`` then counts the
operator's requests alone (its watches and kopf's own requests included).

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
sys.path[:0] = [str(REPO)]

from bench.bench_operator import cpu_seconds, peak_rss_mib  # noqa: E402
from tests.conftest import free_port, repo_env  # noqa: E402
from tests.e2e.conftest import apply_claim, run_manifest  # noqa: E402
from upstream import cluster  # noqa: E402

NS = "bench"


def count(plane: cluster.ControlPlane, kind: str, suffix: str) -> int:
    items = json.loads(plane.kubectl("get", kind, "-n", NS, "-o", "json", timeout=120).stdout)["items"]
    return sum(1 for i in items if i["metadata"]["name"].endswith(suffix))


FLOW_SCHEMA = "retool-bench-operator"


def operator_identity(plane: cluster.ControlPlane, workdir: Path) -> Path:
    """A kubeconfig for the ServiceAccount ``retool-bench/operator`` (cluster-admin) and the FlowSchema
    that counts its requests."""
    plane.kubectl("create", "namespace", "retool-bench")
    plane.kubectl("create", "serviceaccount", "operator", "-n", "retool-bench")
    plane.kubectl("create", "clusterrolebinding", "retool-bench-operator", "--clusterrole=cluster-admin", "--serviceaccount=retool-bench:operator")
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": "operator", "namespace": "retool-bench"}}
    everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
    plane.apply([{"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": FLOW_SCHEMA}, "spec": {
        "priorityLevelConfiguration": {"name": "workload-low"}, "matchingPrecedence": 500, "distinguisherMethod": {"type": "ByUser"},
        "rules": [{"subjects": [subject], "resourceRules": [everything], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}])  # fmt: skip
    token = plane.kubectl("create", "token", "operator", "-n", "retool-bench", "--duration=6h").stdout.strip()
    path = workdir / "operator-kubeconfig"
    path.write_text(json.dumps(cluster.kubeconfig(plane.server, plane.ca.pem, user="operator", token=token)))
    return path


def operator_requests(plane: cluster.ControlPlane) -> int:
    """Requests kube-apiserver dispatched for the operator's FlowSchema so far."""
    code, text = plane.https_get("/metrics")
    if code != 200:
        raise SystemExit(f"kube-apiserver /metrics answered {code}: {text[:200]}")
    prefix = "apiserver_flowcontrol_dispatched_requests_total{"
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix) and f'flow_schema="{FLOW_SCHEMA}"' in line))


def converged(plane: cluster.ControlPlane) -> int:
    """Runs whose status names their first stage's child (the pass that created it was recorded)."""
    items = json.loads(plane.kubectl("get", "retoolruns", "-n", NS, "-o", "json", timeout=300).stdout)["items"]
    return sum(1 for i in items if any(s.get("name") == "prepare" and s.get("job") for s in (i.get("status") or {}).get("stages") or []))


def main(runs: int, timeout: float, resync: float = 3600, steady: float = 0) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    with cluster.running(workdir, log=print) as plane:
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "charts/retool/crds"))
        # kubectl wait errors out while the new CRD has no conditions at all yet: ask until it answers
        plane.wait("the RetoolRun CRD Established", None, lambda: plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=10s", "crd/retoolruns.retool.dev", check=False, timeout=30).returncode == 0, timeout=120)
        plane.kubectl("create", "namespace", NS)
        apply_claim(plane, NS)
        liveness = free_port()
        kubeconfig = operator_identity(plane, workdir)
        env = repo_env(KUBECONFIG=str(kubeconfig), RETOOL_OPERATOR_LIVENESS_PORT=str(liveness), RETOOL_OPERATOR_BIND_ADDRESS="127.0.0.1",
                       RETOOL_OPERATOR_MLFLOW_PARENT_RUNS="false", RETOOL_OPERATOR_RESYNC_SECONDS=str(resync))
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
            apiserver = plane.components["kube-apiserver"].process.pid
            idle_rss, cpu0, api0, requests0 = peak_rss_mib(proc.pid), cpu_seconds(proc.pid), cpu_seconds(apiserver), operator_requests(plane)
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
            while (done := converged(plane)) < runs:
                if time.monotonic() - started > timeout:
                    raise SystemExit(f"timed out: {done} of {runs} runs name their first stage in status")
                time.sleep(2)
            settled = time.monotonic() - started
            cpu, api_cpu, requests = cpu_seconds(proc.pid) - cpu0, cpu_seconds(apiserver) - api0, operator_requests(plane) - requests0
            print(f"{runs} runs created by kubectl in {created:.1f} s; all have sandbox + first stage after {elapsed:.1f} s "
                  f"({runs / elapsed:.1f} runs/s); all statuses name it after {settled:.1f} s; operator CPU {cpu:.1f} s "
                  f"({cpu / runs * 1000:.0f} ms/run); peak RSS {peak_rss_mib(proc.pid):.0f} MiB (idle {idle_rss:.0f}); "
                  f"operator requests {requests} ({requests / runs:.1f}/run); kube-apiserver CPU {api_cpu:.1f} s ({api_cpu / runs * 1000:.0f} ms/run)")
            if steady > 0:
                # Steady state: nothing changes, every run gets its resync pass every `resync` seconds.
                cpu0, api0, requests0, t0 = cpu_seconds(proc.pid), cpu_seconds(apiserver), operator_requests(plane), time.monotonic()
                time.sleep(steady)
                window = time.monotonic() - t0
                cpu, api_cpu, requests = cpu_seconds(proc.pid) - cpu0, cpu_seconds(apiserver) - api0, operator_requests(plane) - requests0
                print(f"steady state over {window:.0f} s (resync every {resync:.0f} s): operator CPU {cpu / window:.2f} cores "
                      f"({cpu / (runs * window / resync) * 1000:.1f} ms per resync pass); {requests / window:.0f} requests/s "
                      f"({requests / (runs * window / resync):.1f} per pass); kube-apiserver CPU {api_cpu / window:.2f} cores; "
                      f"peak RSS {peak_rss_mib(proc.pid):.0f} MiB")
        finally:
            proc.terminate()
            stopping = time.monotonic()
            try:
                proc.wait(120)  # kopf stops every run's timer and handler task first: 1,000 runs took more than 20 s
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            print(f"operator stopped {time.monotonic() - stopping:.1f} s after SIGTERM (exit {proc.returncode})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--resync", type=float, default=3600, help="the operator's resync interval (RETOOL_OPERATOR_RESYNC_SECONDS)")
    parser.add_argument("--steady", type=float, default=0, help="then measure this many seconds of steady state (resync passes only)")
    args = parser.parse_args()
    main(args.runs, args.timeout, args.resync, args.steady)
