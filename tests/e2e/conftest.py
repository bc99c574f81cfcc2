"""The end-to-end fixtures: one real control plane per test session (upstream/cluster.py: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kwok, KubeRay, Kueue), the chart installed into it
with `helm install`, and the operator running as its pod runs it (``python -m retool_operator`` with the
chart's ConfigMap as its environment and the chart's ServiceAccount token as its identity).

The operator's process runs on this machine, so three things of its pod are mapped here: it listens on
127.0.0.1 at free ports (the chart's ``webhook.url`` points the API server there, see upstream/cluster.py
for why a Service cannot), its webhook certificate is a file instead of the mounted Secret, and its
kubeconfig carries the token the TokenRequest API issued for the chart's ServiceAccount instead of the
projected one.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.embedded.servers import mlflow_server as local_mlflow
from tests.conftest import REPO, free_port, repo_env
from upstream import cluster
from upstream.cluster import ControlPlane

HELM = REPO / ".tools" / "helm"
RELEASE = "retool"
RELEASE_NAMESPACE = "retool-system"


def eventually(what: str, probe: Callable[[], Any], timeout: float = 60, interval: float = 0.3, show: Callable[[], Any] | None = None) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last value (or
    what ``show`` returns then: the object the probe judged, when the probe only says yes or no)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {show() if show else last!r}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make helm` fetches helm and kubectl")
    lines: list[str] = []
    try:
        with cluster.running(tmp_path_factory.mktemp("control-plane"), log=lines.append) as plane:
            sys.stderr.write(f"\ne2e control plane: built/cached in {plane.timings['build']:.1f} s, started in "
                             f"{plane.timings['total']:.1f} s; logs in {plane.workdir / 'logs'}\n")
            yield plane
    except (cluster.build.BuildError, cluster.StartError) as exc:
        pytest.fail(f"the end-to-end control plane could not be built or started: {exc}", pytrace=False)


class Operator:
    """``python -m retool_operator`` as the chart's pod runs it; restartable mid-test."""

    def __init__(self, plane: ControlPlane, env: dict[str, str], workdir: Path):
        self.plane = plane
        self.env = env
        self.log = workdir / "operator.log"
        self.liveness = int(env["RETOOL_OPERATOR_LIVENESS_PORT"])
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "retool_operator"], env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def healthy() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"the operator exited ({self.process.returncode}):\n{self.tail()}")
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{self.liveness}/healthz", timeout=2).status == 200
            except OSError:
                return False

        eventually("the operator's /healthz", healthy, timeout=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def kill(self) -> None:
        """SIGKILL, as the kubelet does past the grace period or the kernel's OOM killer: no cleanup runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


@pytest.fixture(scope="session")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`helm install` of charts/retool, webhook certificate from a Secret, MLflow a real local server."""
    plane = control_plane
    work = tmp_path_factory.mktemp("release")
    webhook_port = free_port()
    pair = plane.ca.issue("retool-webhook", common_name="retool-webhook", server=True, ips=("127.0.0.1",),
                          dns=(f"{RELEASE}-webhook.{RELEASE_NAMESPACE}.svc",))
    plane.kubectl("create", "namespace", RELEASE_NAMESPACE)
    plane.kubectl("create", "secret", "tls", "retool-webhook-tls", "-n", RELEASE_NAMESPACE,
                  f"--cert={pair.cert}", f"--key={pair.key}")
    with local_mlflow(work / "mlflow", start_timeout_s=90) as mlflow:
        values = {
            "webhook": {"url": f"https://127.0.0.1:{webhook_port}", "port": webhook_port,
                        "certificates": {"source": "secret", "secretName": "retool-webhook-tls",
                                         "caBundle": base64.b64encode(plane.ca.pem).decode()}},
            "mlflow": {"enabled": False, "externalTrackingUri": mlflow.base_url},
        }
        values_file = work / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        started = time.monotonic()
        helm = subprocess.run([str(HELM), "install", RELEASE, str(REPO / "charts" / "retool"), "-n", RELEASE_NAMESPACE,
                               "--kubeconfig", str(plane.kubeconfig), "-f", str(values_file), "--wait", "--timeout", "2m"],
                              capture_output=True, text=True, timeout=180)
        assert helm.returncode == 0, f"helm install failed:\n{helm.stdout}\n{helm.stderr}"
        helm_seconds = time.monotonic() - started

        deployment = plane.get_json("deployment", f"{RELEASE}-operator", "-n", RELEASE_NAMESPACE)
        service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        config = plane.get_json("configmap", f"{RELEASE}-operator-config", "-n", RELEASE_NAMESPACE)["data"]
        token = plane.kubectl("create", "token", service_account, "-n", RELEASE_NAMESPACE, "--duration=6h").stdout.strip()
        operator_kubeconfig = work / "operator-kubeconfig"
        operator_kubeconfig.write_text(yaml.safe_dump(cluster.kubeconfig(plane.server, plane.ca.pem, user=service_account,
                                                                         token=token)))
        certs = work / "webhook-certs"
        certs.mkdir()
        (certs / "tls.crt").write_bytes(pair.cert.read_bytes())
        (certs / "tls.key").write_bytes(pair.key.read_bytes())
        env = repo_env(**config)
        for key in [k for k in env if k.startswith("KUBECONFIG") or k.startswith("KUBERNETES_SERVICE")]:
            del env[key]
        env.update(
            KUBECONFIG=str(operator_kubeconfig),
            RETOOL_OPERATOR_BIND_ADDRESS="127.0.0.1",
            RETOOL_OPERATOR_LIVENESS_PORT=str(free_port()),
            RETOOL_OPERATOR_WEBHOOK_CERT_DIR=str(certs),
            # the timer that re-derives status: short, so a missed event costs seconds in a test
            RETOOL_OPERATOR_RESYNC_SECONDS="5",
        )
        operator = Operator(plane, env, work)
        operator.start()
        try:
            yield {"operator": operator, "service_account": service_account, "token_kubeconfig": operator_kubeconfig,
                   "helm_seconds": helm_seconds, "mlflow": mlflow.base_url, "config": config}
        finally:
            operator.stop()


_namespaces = itertools.count(1)


@pytest.fixture
def namespace(control_plane: ControlPlane, release: dict[str, Any]) -> Iterator[str]:
    """A fresh namespace with a 1 TiB ReadWriteMany claim `retool-data`, statically provisioned (a
    PersistentVolume bound by the real PV controller: the control plane has no provisioner)."""
    name = f"e2e-{os.getpid() % 1000}-{next(_namespaces)}"
    control_plane.kubectl("create", "namespace", name)
    apply_claim(control_plane, name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def shared_namespace(control_plane: ControlPlane, release: dict[str, Any]) -> str:
    """One namespace for the checks that create nothing in it (RBAC questions)."""
    control_plane.kubectl("create", "namespace", "e2e-shared")
    return "e2e-shared"


def apply_claim(plane: ControlPlane, namespace: str, claim: str = "retool-data") -> None:
    pv = f"{namespace}-{claim}"
    plane.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/var/lib/retool-e2e/{pv}"},
                  "claimRef": {"namespace": namespace, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Ti"}}}},
    ])


def run_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A small NVIDIA run on the claim `retool-data` (one H200 node), ``spec`` merged over it."""
    base: dict[str, Any] = {
        "model": {"base": "Qwen/Qwen2.5-0.5B-Instruct"},
        "hardware": {"accelerator": "nvidia", "product": "NVIDIA-H200", "nodes": 1, "devicesPerNode": 8,
                     "resources": {"requests": {"cpu": "8", "memory": "48Gi"}, "limits": {"memory": "64Gi"}}},
        "storage": {"pvc": {"claimName": "retool-data"}},
        "sandbox": {"maxConcurrent": 16, "perReplicaConcurrency": 16},
        "failurePolicy": {"maxRetries": 1, "backoffSeconds": 2},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": {"name": name, "namespace": namespace},
            "spec": base}


class Cluster:
    """What a scenario does with the control plane: kubectl as the admin, reads, and kwok's exit codes."""

    def __init__(self, plane: ControlPlane, release: dict[str, Any]):
        self.plane = plane
        self.release = release
        self.operator: Operator = release["operator"]

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        return self.plane.kubectl(*args, **kwargs)

    def apply(self, doc: dict[str, Any]) -> subprocess.CompletedProcess:
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def items(self, kind: str, namespace: str, *selector: str) -> list[dict[str, Any]]:
        return json.loads(self.kubectl("get", kind, "-n", namespace, *selector, "-o", "json").stdout)["items"]

    def run_status(self, name: str, namespace: str) -> dict[str, Any]:
        return (self.get("retoolrun", name, namespace) or {}).get("status") or {}

    def stage(self, name: str, namespace: str, stage: str) -> dict[str, Any]:
        return next((s for s in self.run_status(name, namespace).get("stages", []) if s.get("name") == stage), {})

    def wait_stage(self, name: str, namespace: str, stage: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            entry = self.stage(name, namespace, stage)
            return entry if entry.get("state") in states else None

        return eventually(f"stage {stage} of {namespace}/{name} in {states} (operator log:\n{self.operator.tail(15)}\n)",
                          probe, timeout=timeout)

    def gpu_holders(self) -> list[str]:
        """``namespace/pod on node`` of every pod in the cluster that holds NVIDIA GPUs and has not ended."""
        pods = json.loads(self.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
        out = []
        for pod in pods:
            wants = any("nvidia.com/gpu" in ((c.get("resources") or {}).get("requests") or {}) for c in pod["spec"].get("containers", []))
            if wants and pod["status"].get("phase") not in ("Succeeded", "Failed") and pod["spec"].get("nodeName"):
                out.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']} on {pod['spec']['nodeName']}")
        return out

    def pods_of_job(self, job: str, namespace: str) -> list[dict[str, Any]]:
        return self.items("pods", namespace, "-l", f"batch.kubernetes.io/job-name={job}")

    def finish_pods(self, job: str, namespace: str, exit_code: int, timeout: float = 60) -> None:
        """End the Running pods of ``job`` with ``exit_code`` (kwok's stage, upstream/cluster.py)."""
        pods = eventually(f"a Running pod of job {namespace}/{job}",
                          lambda: [p for p in self.pods_of_job(job, namespace) if p["status"].get("phase") == "Running"],
                          timeout=timeout)
        for pod in pods:
            self.kubectl("annotate", "pod", pod["metadata"]["name"], "-n", namespace, "--overwrite",
                         f"{cluster.EXIT_CODE_ANNOTATION}={exit_code}")

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.items("events", namespace) if e["involvedObject"].get("name") == name]


@pytest.fixture
def kube(control_plane: ControlPlane, release: dict[str, Any]) -> Cluster:
    return Cluster(control_plane, release)
