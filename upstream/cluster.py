"""A local Kubernetes control plane made of the real programs, on 127.0.0.1, for the end-to-end tests and
for developers (``make e2e-cluster``).

What runs, each a process of the binary ``upstream.build`` made from its Go module:

- etcd, kube-apiserver (Node,RBAC authorization; NamespaceLifecycle, LimitRanger, ServiceAccount,
  PodSecurity, ResourceQuota, the webhook admission plugins ...), kube-controller-manager (every default
  controller: Job, ReplicaSet/Deployment, garbage collector, namespace, ResourceQuota, service-account
  and token controllers, PV binder, EndpointSlice ...) and kube-scheduler;
- kwok: plays the kubelets of fake nodes (labelled like GPU Feature Discovery's NVIDIA nodes and like
  Ascend nodes) and the lifecycle of their pods, through stages we define here: a scheduled pod becomes
  Running and Ready; a Running pod annotated ``e2e.retool.dev/exit-code`` ends Succeeded (``"0"``) or
  Failed (anything else); a deleted pod goes away (the kubelet's part of graceful deletion);
- the KubeRay operator with its CRDs from its module, and Kueue's manager with its CRDs, its conversion
  webhook and its admission webhooks from its module.

What stays emulated, and why:

- Containers never run: kwok writes pod status, so a stage "runs" until a test sets its exit code.
- Nothing reaches a pod's IP. kwok gives pods addresses that nothing routes to, and Kubernetes refuses
  loopback addresses in EndpointSlices (``ValidateEndpointIP`` in pkg/apis/core/validation, v1.36), so a
  Service with a selector cannot lead the API server (webhooks) or KubeRay (the Ray dashboard) to a
  process on this machine. Kueue's webhook Service is therefore of type ExternalName ``localhost`` (the
  API server resolves those to the name and still checks the certificate against the Service's DNS
  name, so Kueue's own certificate management works unchanged); the chart's webhook, whose Service the
  chart owns, is registered by URL (its ``webhook.url``) with a certificate of our CA.
- KubeRay reaches a Ray dashboard by the head Service's DNS name (``FetchHeadServiceURL``,
  controllers/ray/utils/util.go, v1.6.1: ``<svc>.<ns>.svc.<CLUSTER_DOMAIN>:<port>``), which nothing
  resolves here. Where this machine allows it (root, ``unshare``), the KubeRay operator runs in a mount
  namespace of its own with ``kuberay-hosts`` of the workdir bind-mounted over /etc/hosts, and
  ``ControlPlane.resolve_for_kuberay`` maps a head Service's name to 127.0.0.1: a test then runs a real
  Ray head there and KubeRay reads the Ray job's status from it (``GetJobInfo``), completes or fails the
  RayJob and deletes its cluster as it does on a cluster. Elsewhere (``kuberay_resolves_names`` False)
  a RayJob gets its RayCluster and, once the head pod is Ready, its submitter Job, and stays Running
  from then on; its end comes from the submitter Job's failure (KubeRay's ``SubmissionFailed``) or a test.
- No container runtime, no kube-proxy, no CNI, no DNS, no volume provisioner: PersistentVolumes are
  created by the tests (static provisioning, bound by the real PV controller).

    python -m upstream.cluster [--workdir DIR]   # build what is missing, start, print the kubeconfig, wait for Ctrl-C
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from retool.embedded.process import free_port
from upstream import build
from upstream import pins as pins_module
from upstream.pki import CertificateAuthority, Pair, service_account_keys

PRIVATE_HOSTS = ["unshare", "--mount", "--propagation", "private", "--"]
"""A mount namespace of its own, so a bind mount over /etc/hosts is seen by one process only."""


def private_hosts_supported() -> bool:
    """Whether a process can be given a private /etc/hosts here (root and util-linux ``unshare``)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not Path("/etc/hosts").is_file():
        return False
    probe = subprocess.run([*PRIVATE_HOSTS, "true"], capture_output=True, check=False)
    return probe.returncode == 0


def with_private_hosts(hosts: Path, args: list[str]) -> list[str]:
    """``args`` run with ``hosts`` bind-mounted over /etc/hosts in a mount namespace of their own
    (``exec`` keeps the pid, so stopping the component stops the program)."""
    return [*PRIVATE_HOSTS, "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *args]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML has it: the upstream CRDs are megabytes."""

EXIT_CODE_ANNOTATION = "e2e.retool.dev/exit-code"
"""Set on a Running pod to end it: ``"0"`` -> Succeeded, anything else -> Failed with that exit code."""

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
NODE_IP = "10.255.0.1"
"""Addresses kwok writes into node and pod status; nothing listens on them (see the module docstring)."""

KUEUE_NAMESPACE = "kueue-system"
KUEUE_WEBHOOK_SERVICE = "kueue-webhook-service"
KUEUE_WEBHOOK_SECRET = "kueue-webhook-server-cert"
KUEUE_FRAMEWORKS = ("batch/job", "ray.io/rayjob", "ray.io/raycluster", "pod", "deployment", "statefulset")


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the process that started it dies (Linux
    PR_SET_PDEATHSIG, kept across exec), so a killed ``python -m upstream.cluster`` or test session leaves no
    etcd or API server behind. The components run in sessions of their own (no terminal's Ctrl-C reaches
    them), which is why the signal, not the process group, carries the parent's death."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


class StartError(RuntimeError):
    """A component did not start; the message names it and ends with its log."""




# ---------------------------------------------------------------- pure: manifests and configurations


@dataclass(frozen=True)
class FakeNode:
    name: str
    labels: dict[str, str]
    capacity: dict[str, str]


NODES: tuple[FakeNode, ...] = (
    FakeNode("cpu-0", {"node-role.retool.dev/cpu": ""}, {"cpu": "64", "memory": "512Gi", "pods": "110"}),
    FakeNode("cpu-1", {"node-role.retool.dev/cpu": ""}, {"cpu": "64", "memory": "512Gi", "pods": "110"}),
    # GPU Feature Discovery's labels (gpu-feature-discovery README: nvidia.com/gpu.product, .count,
    # .memory, .present) and the device plugin's extended resource.
    FakeNode(
        "h200-0",
        {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "143771",
         "nvidia.com/gpu.present": "true"},
        {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": "8"},
    ),
    FakeNode(
        "h200-1",
        {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "143771",
         "nvidia.com/gpu.present": "true"},
        {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": "8"},
    ),
    # Ascend's device plugin label and resource (MindCluster docs: accelerator=huawei-Ascend910).
    FakeNode("ascend-0", {"accelerator": "huawei-Ascend910"},
             {"cpu": "192", "memory": "1536Gi", "pods": "110", "huawei.com/Ascend910": "8"}),
)


def node_manifest(node: FakeNode) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "type": "kwok", **node.labels},
        },
        "spec": {},
        "status": {"capacity": dict(node.capacity), "allocatable": dict(node.capacity)},
    }


_RUNNING_STATUS = """\
{{ $now := Now }}
conditions:
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: PodScheduled}
containerStatuses:
{{ range .spec.containers }}
- {image: {{ .image | Quote }}, name: {{ .name | Quote }}, ready: true, started: true, restartCount: 0,
   state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- {image: {{ .image | Quote }}, name: {{ .name | Quote }}, ready: true, restartCount: 0,
   state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


_NODE_STATUS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- {lastHeartbeatTime: {{ $now | Quote }}, lastTransitionTime: {{ $since | Quote }}, message: {{ .message | Quote }},
   reason: {{ .reason | Quote }}, status: {{ .status | Quote }}, type: {{ .type | Quote }}}
{{ end }}
addresses:
- {address: {{ NodeIP | Quote }}, type: InternalIP}
- {address: {{ NodeName | Quote }}, type: Hostname}
allocatable:
{{ YAML .status.allocatable 1 }}
capacity:
{{ YAML .status.capacity 1 }}
nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: {{ printf "kwok-%s" Version | Quote }},
           containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}, kernelVersion: "", osImage: "", machineID: "",
           bootID: "", systemUUID: "", kubeProxyVersion: ""}
phase: Running
"""


def node_stages() -> list[dict[str, Any]]:
    """kwok Stages for nodes: Ready (with kwok's NodeConditions) once created, the status refreshed every
    20-25 s. kwok also renews each node's Lease (``--node-lease-duration-seconds``), but the status
    heartbeat alone must stay inside the node lifecycle controller's grace period (50 s by default in
    Kubernetes 1.36, pkg/controller/nodelifecycle): with a minute between refreshes a loaded machine saw
    nodes go NotReady mid-scenario and their pods marked not Ready (the sandbox then "lost" its replica)."""
    ready = '.status.conditions.[] | select( .type == "Ready" ) | .status'

    def stage(name: str, expressions: list[dict[str, Any]], delay_ms: int | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"resourceRef": {"apiGroup": "v1", "kind": "Node"}, "selector": {"matchExpressions": expressions},
                                "next": {"statusTemplate": _NODE_STATUS}}
        if delay_ms:
            spec["delay"] = {"durationMilliseconds": delay_ms, "jitterDurationMilliseconds": delay_ms + 5000}
        return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}

    return [
        stage("retool-e2e-node-ready", [{"key": ready, "operator": "NotIn", "values": ["True"]}], None),
        stage("retool-e2e-node-heartbeat", [{"key": ".status.phase", "operator": "In", "values": ["Running"]},
                                            {"key": ready, "operator": "In", "values": ["True"]}], 20000),
    ]


def _terminated_status(phase: str, reason: str) -> str:
    return (
        "{{ $now := Now }}\n"
        f"{{{{ $code := index .metadata.annotations {json.dumps(EXIT_CODE_ANNOTATION)} }}}}\n"
        "conditions:\n"
        '- {lastTransitionTime: {{ $now | Quote }}, status: "False", type: Ready, reason: PodCompleted}\n'
        '- {lastTransitionTime: {{ $now | Quote }}, status: "False", type: ContainersReady, reason: PodCompleted}\n'
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        "- {image: {{ .image | Quote }}, name: {{ .name | Quote }}, ready: false, started: false, restartCount: 0,\n"
        f"   state: {{terminated: {{exitCode: {{{{ $code }}}}, reason: {reason}, message: {{{{ printf \"exit code %s (set by the test)\" $code | Quote }}}},\n"
        "   startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}}\n"
        "{{ end }}\n"
        f"phase: {phase}\n"
    )


def pod_stages() -> list[dict[str, Any]]:
    """kwok Stages (kwok.x-k8s.io/v1alpha1) for pods: Running+Ready once scheduled, Succeeded/Failed when a
    test annotates the exit code, removed once deleted."""
    alive = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    annotation = f'.metadata.annotations["{EXIT_CODE_ANNOTATION}"]'

    def stage(name: str, expressions: list[dict[str, Any]], nxt: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
                "spec": {"resourceRef": {"apiGroup": "v1", "kind": "Pod"}, "selector": {"matchExpressions": expressions},
                         "next": nxt}}

    return [
        stage("retool-e2e-pod-running",
              [alive, {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
               {"key": ".spec.nodeName", "operator": "Exists"}],
              {"statusTemplate": _RUNNING_STATUS}),
        stage("retool-e2e-pod-succeeded",
              [alive, {"key": ".status.phase", "operator": "In", "values": ["Running"]},
               {"key": annotation, "operator": "In", "values": ["0"]}],
              {"statusTemplate": _terminated_status("Succeeded", "Completed")}),
        stage("retool-e2e-pod-failed",
              [alive, {"key": ".status.phase", "operator": "In", "values": ["Running"]},
               {"key": annotation, "operator": "Exists"}, {"key": annotation, "operator": "NotIn", "values": ["0"]}],
              {"statusTemplate": _terminated_status("Failed", "Error")}),
        stage("retool-e2e-pod-deleted", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
              {"delete": True}),
    ]


def kubeconfig(server: str, ca_pem: bytes, *, user: str, cert: Pair | None = None, token: str | None = None,
               namespace: str | None = None) -> dict[str, Any]:
    creds: dict[str, Any] = {}
    if cert is not None:
        creds = {"client-certificate-data": base64.b64encode(cert.cert.read_bytes()).decode(),
                 "client-key-data": base64.b64encode(cert.key.read_bytes()).decode()}
    if token is not None:
        creds = {"token": token}
    context: dict[str, Any] = {"cluster": "retool-e2e", "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "retool-e2e",
        "clusters": [{"name": "retool-e2e", "cluster": {"server": server,
                                                        "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "retool-e2e", "context": context}],
    }


def kueue_configuration(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's manager Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2 at the pin): its
    shipped defaults (config/components/manager/controller_manager_config.yaml) with the listeners on
    127.0.0.1, no leader election, its internal certificate management for its webhook Service, and the
    integrations this platform's children use (Jobs, RayJobs, RayClusters) plus the workload kinds whose
    webhooks the shipped manifests register (pod, deployment, statefulset: Kueue leaves unqueued ones alone)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": KUEUE_WEBHOOK_SERVICE,
                                   "webhookSecretName": KUEUE_WEBHOOK_SECRET},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        # The visibility API server reads its certificate from a fixed /visibility directory
        # (pkg/visibility/server.go) and is an aggregated API we do not test.
        "featureGates": {"VisibilityOnDemand": False},
    }


def webhook_to_service(doc: dict[str, Any], service: dict[str, Any], name_prefix: str) -> dict[str, Any]:
    """A webhook configuration from upstream manifests pointed at ``service`` (name, namespace, port), each
    webhook keeping its path; named as Kueue's kustomization names it (``name_prefix`` + name)."""
    out = json.loads(json.dumps(doc))
    out["metadata"]["name"] = name_prefix + out["metadata"]["name"]
    for hook in out.get("webhooks") or []:
        path = hook["clientConfig"]["service"].get("path", "/")
        hook["clientConfig"] = {"service": {**service, "path": path}}
    return out


_CONVERSION_PATCH = re.compile(r"^-\s*path:\s*patches/webhook_in_([a-z]+)\.yaml\s*$", re.M)


def crd_established(crd: dict[str, Any]) -> bool:
    """Whether the API server has set the CRD's Established condition to True (no conditions yet: not yet)."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def conversion_webhook_crds(kustomization: str) -> set[str]:
    """Plural names of the CRDs whose kustomization enables the conversion webhook (uncommented
    ``patches/webhook_in_<plural>.yaml`` lines in Kueue's config/components/crd/kustomization.yaml)."""
    return set(_CONVERSION_PATCH.findall(kustomization))


def with_conversion_webhook(crd: dict[str, Any], service: dict[str, Any]) -> dict[str, Any]:
    """The CRD with Kueue's conversion webhook (its patches/webhook_in_*.yaml), served by ``service``."""
    out = json.loads(json.dumps(crd))
    out["spec"]["conversion"] = {
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {"service": {**service, "path": "/convert"}}},
    }
    return out


# ---------------------------------------------------------------- I/O: processes


@dataclass
class Component:
    name: str
    args: list[str]
    log: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


@dataclass
class ControlPlane:
    workdir: Path
    server: str = ""
    kubeconfig: Path = Path()
    ca: CertificateAuthority | None = None
    components: dict[str, Component] = field(default_factory=dict)
    programs: dict[str, Path] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    log: Callable[[str], None] = lambda _line: None
    kuberay_resolves_names: bool = False
    """Whether KubeRay runs with a private /etc/hosts (``resolve_for_kuberay`` works)."""
    _stopping: threading.Event = field(default_factory=threading.Event)

    # ------------------------------------------------------------ helpers

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG",))}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(extra)
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str(kubectl_binary()), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def apply(self, docs: list[dict[str, Any]], *, server_side: bool = True) -> None:
        # JSON, not YAML: the CRDs are megabytes and PyYAML's emitter takes minutes on a loaded machine
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        flags = ["--server-side", "--force-conflicts", "--field-manager=retool-e2e"] if server_side else []
        self.kubectl("apply", *flags, "-f", "-", input=text, timeout=180)

    def apply_files(self, files: list[Path]) -> None:
        """Upstream manifests as they are (server-side: the CRDs are too big for the last-applied annotation)."""
        args = [a for f in files for a in ("-f", str(f))]
        self.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=retool-e2e", *args, timeout=180)

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def https_get(self, path: str) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
        admin = self.pki / "admin"
        ctx.load_cert_chain(str(admin.with_suffix(".crt")), str(admin.with_suffix(".key")))
        try:
            with urllib.request.urlopen(self.server + path, context=ctx, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def wait(self, what: str, component: str | None, ready: Callable[[], bool], timeout: float = 120) -> None:
        """Poll ``ready`` until it holds; a clear StartError naming ``what`` (and the component's log) if not."""
        deadline = time.monotonic() + timeout
        while True:
            comp = self.components.get(component) if component else None
            if comp is not None and not comp.alive():
                raise StartError(f"{component} exited ({comp.process.returncode}) while waiting for {what}; "
                                 f"last lines of {comp.log}:\n{comp.tail()}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                detail = f"; last lines of {comp.log}:\n{comp.tail()}" if comp is not None else ""
                raise StartError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
            time.sleep(0.25)

    def run(self, name: str, args: list[str], **env: str) -> Component:
        comp = Component(name, args, self.workdir / "logs" / f"{name}.log", env=self.env(**env))
        comp.start()
        self.components[name] = comp
        return comp

    @property
    def kuberay_hosts(self) -> Path:
        return self.workdir / "kuberay-hosts"

    def resolve_for_kuberay(self, name: str, address: str = "127.0.0.1") -> None:
        """Make ``name`` (a head Service's DNS name) resolve to ``address`` for the KubeRay operator.

        Go's resolver re-reads /etc/hosts when it changes (at most every 5 s), so KubeRay sees it on a
        later reconcile; raises StartError where KubeRay was started without a private /etc/hosts."""
        if not self.kuberay_resolves_names:
            raise StartError("KubeRay runs without a private /etc/hosts on this machine (needs root and unshare)")
        with open(self.kuberay_hosts, "a") as hosts:
            hosts.write(f"{address} {name}\n")

    def restart(self, name: str, *, while_down: Callable[[], None] | None = None, timeout: float = 180) -> None:
        """Stop one component (SIGTERM, as a node drain or a crash-looping static pod does) and start it again
        with the same arguments; ``while_down`` runs in between. Returns once the API server is ready again
        (/readyz also checks etcd), so a restarted etcd or kube-apiserver is serving when this returns."""
        comp = self.components[name]
        comp.stop()
        if while_down is not None:
            while_down()
        comp.start()
        self.wait(f"kube-apiserver /readyz after restarting {name}", name, lambda: self.https_get("/readyz")[0] == 200, timeout=timeout)

    def etcd_compact(self) -> int:
        """Compact etcd's history up to its current revision, at once (what kube-apiserver's periodic
        compaction does every 5 minutes), through etcd's v3 JSON gateway: every resource version before
        it is gone, so a watch resumed from one gets 410 Gone. Returns the revision."""
        url = f"http://127.0.0.1:{self.ports['etcd']}/v3/kv"

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(f"{url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())

        revision = int(post("range", {"key": base64.b64encode(b"/registry/namespaces/default").decode()})["header"]["revision"])
        post("compaction", {"revision": revision, "physical": True})
        return revision

    def stop(self) -> None:
        self._stopping.set()
        for comp in reversed(list(self.components.values())):
            comp.stop()

    # ------------------------------------------------------------ start

    def start(self, programs: dict[str, Path]) -> ControlPlane:
        self.programs = programs
        started = time.monotonic()
        try:
            for name, step in (("core", self._start_core), ("nodes", self._start_nodes), ("kuberay", self._start_kuberay),
                               ("kueue", self._start_kueue)):
                t0 = time.monotonic()
                step()
                self.timings[name] = time.monotonic() - t0
                self.log(f"  {name} up in {self.timings[name]:.1f} s")
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - started
        return self

    def _start_core(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # every start is a fresh cluster: new certificates cannot read an old etcd's tokens and secrets
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        self.ca = CertificateAuthority(self.pki)
        p = self.ports
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            p[name] = free_port()
        self.server = f"https://127.0.0.1:{p['apiserver']}"
        serving = self.ca.issue("apiserver", common_name="kube-apiserver", server=True,
                                dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                     "kubernetes.default.svc.cluster.local"), ips=("127.0.0.1", "10.96.0.1"))
        admin = self.ca.issue("admin", common_name="retool-e2e-admin", organizations=("system:masters",), client=True)
        sa = service_account_keys(self.pki)
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.server, self.ca.pem, user="admin", cert=admin)))
        self.kubeconfig.chmod(0o600)

        self.log(f"etcd on 127.0.0.1:{p['etcd']}")
        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd-peer']}"
        self.run("etcd", [str(self.programs["etcd"]), "--name=e2e", f"--data-dir={self.workdir / 'etcd'}",
                          f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                          f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                          f"--initial-cluster=e2e={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
                          "--listen-metrics-urls="])
        self.wait("etcd /health", "etcd", lambda: b'"health":"true"' in urllib.request.urlopen(etcd_url + "/health", timeout=2).read())

        self.log(f"kube-apiserver on {self.server}")
        self.run("kube-apiserver", [
            str(self.programs["kube-apiserver"]), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.cert_path}",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,PodSecurity,"
            "Priority,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection,RuntimeClass,"
            "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])
        self.wait("kube-apiserver /readyz", "kube-apiserver", lambda: self.https_get("/readyz")[0] == 200, timeout=180)

        self.log("kube-controller-manager and kube-scheduler")
        self.run("kube-controller-manager", [
            str(self.programs["kube-controller-manager"]), f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={p['controller-manager']}", "--leader-elect=false",
            f"--root-ca-file={self.ca.cert_path}", f"--service-account-private-key-file={sa.key}",
            "--use-service-account-credentials=true", "--controllers=*",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--kube-api-qps=500", "--kube-api-burst=1000",
            # GC of terminated pods and of namespaces quickly enough for a test session
            "--concurrent-gc-syncs=20", "--v=1",
        ])
        self.run("kube-scheduler", [
            str(self.programs["kube-scheduler"]), f"--kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={p['scheduler']}", "--leader-elect=false", "--kube-api-qps=500", "--kube-api-burst=1000",
            "--v=1",
        ])
        # The service-account controller in kube-controller-manager creates `default` in every namespace:
        # without it no pod is admitted (ServiceAccount admission).
        self.wait("the default ServiceAccount (kube-controller-manager's service-account controller)",
                  "kube-controller-manager",
                  lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
                  timeout=120)

    def _start_nodes(self) -> None:
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(yaml.safe_dump_all([*node_stages(), *pod_stages()], sort_keys=False))
        self.log("kwok and its nodes")
        kwok_verbosity = [f"-v={os.environ['RETOOL_E2E_KWOK_LOG']}"] if os.environ.get("RETOOL_E2E_KWOK_LOG") else []
        self.run("kwok", [str(self.programs["kwok"]), f"--kubeconfig={self.kubeconfig}", f"--config={stages}",
                          "--manage-all-nodes=true", "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}", f"--node-ip={NODE_IP}",
                          f"--server-address=127.0.0.1:{self.ports['kwok']}", *kwok_verbosity])
        self.apply([node_manifest(n) for n in NODES], server_side=False)

        def nodes_ready() -> bool:
            items = self.get_json("nodes")["items"]
            ready = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in n.get("status", {}).get("conditions", []))]
            return len(ready) == len(NODES)

        self.wait("kwok's nodes Ready", "kwok", nodes_ready)

    def module_dir(self, module: str, version: str) -> Path:
        out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                             cwd=tempfile.gettempdir())
        if out.returncode != 0:
            raise StartError(f"go mod download {module}@{version} failed: {out.stderr.strip() or out.stdout.strip()}")
        return Path(json.loads(out.stdout)["Dir"])

    def _start_kuberay(self) -> None:
        pins = pins_module.pins()
        module = self.module_dir(build.PROGRAMS["kuberay-operator"].module, pins["KUBERAY_VERSION"])
        crds = sorted((module / "config" / "crd" / "bases").glob("*.yaml"))
        self.log(f"KubeRay {pins['KUBERAY_VERSION']}: {len(crds)} CRDs and the operator")
        self.apply_files(crds)
        self._wait_crds(*[a for f in crds for a in ("-f", str(f))])
        health = self.ports["kuberay-health"] = free_port()
        args = [
            str(self.programs["kuberay-operator"]), f"--health-probe-bind-address=127.0.0.1:{health}",
            "--metrics-addr=0", "--enable-leader-election=false", "--log-stdout-encoder=console",
        ]
        self.kuberay_resolves_names = private_hosts_supported()
        if self.kuberay_resolves_names:
            # appended to in place (never replaced: the bind mount holds the inode)
            self.kuberay_hosts.write_text(Path("/etc/hosts").read_text() + "\n# e2e: Ray head Services on this machine\n")
            args = with_private_hosts(self.kuberay_hosts, args)
        else:
            self.log("  KubeRay cannot be given a private /etc/hosts here (needs root and unshare): the Ray dashboard stays unreachable")
        self.run("kuberay-operator", args)
        self.wait("the KubeRay operator's /readyz", "kuberay-operator",
                  lambda: urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200)

    def _mount_secret(self, namespace: str, name: str, directory: Path, period: float = 1.0) -> None:
        """Keep ``directory`` holding the Secret's keys (the kubelet's secret volume), until stop()."""

        def sync() -> None:
            while not self._stopping.is_set():
                proc = self.kubectl("get", "secret", name, "-n", namespace, "-o", "json", check=False)
                if proc.returncode == 0:
                    for key, value in (json.loads(proc.stdout).get("data") or {}).items():
                        data = base64.b64decode(value)
                        target = directory / key
                        if not target.exists() or target.read_bytes() != data:
                            partial = directory / f".{key}.partial"
                            partial.write_bytes(data)
                            partial.replace(target)
                self._stopping.wait(period)

        threading.Thread(target=sync, name=f"secret-volume-{name}", daemon=True).start()

    def _wait_crds(self, *objects: str, timeout: float = 90) -> None:
        """Poll until every CRD in ``objects`` (kubectl's words for them: ``crd/NAME``, or ``-f FILE``, which
        kubectl reads itself) is Established; each poll asks only for those not yet Established. Not ``kubectl
        wait --for=condition=Established``: kubectl v1.36 fails at once, instead of waiting, on a CRD whose
        status has no conditions yet (".status.conditions accessor error: <nil> is of the type <nil>"), which
        is what a just-created CRD has on a busy machine."""
        pending = list(objects)

        def established() -> bool:
            answer = json.loads(self.kubectl("get", *pending, "-o", "json", timeout=30).stdout)
            listed = answer.get("items", [answer])  # one object asked: the object itself, not a List
            pending[:] = [f"crd/{crd['metadata']['name']}" for crd in listed if not crd_established(crd)]
            return not pending

        self.wait("the CRDs to be Established", None, established, timeout=timeout)

    def _start_kueue(self) -> None:
        """Kueue as its manifests install it, with its own certificate management (it signs its webhook
        certificate for kueue-webhook-service.kueue-system.svc and injects the CA into its webhook
        configurations and CRD conversion webhooks). Only the Service differs: type ExternalName
        ``localhost``, and the webhook port on every clientConfig. The API server's service resolver sends
        an ExternalName Service's calls to that host (k8s.io/apiserver pkg/util/proxy ResolveCluster) and
        still checks the certificate against the Service's DNS name."""
        pins = pins_module.pins()
        module = self.module_dir(build.PROGRAMS["kueue"].module, pins["KUEUE_VERSION"])
        port = self.ports["kueue-webhook"] = free_port()
        health = self.ports["kueue-health"] = free_port()
        service = {"name": KUEUE_WEBHOOK_SERVICE, "namespace": KUEUE_NAMESPACE, "port": port}

        crd_dir = module / "config" / "components" / "crd"
        converted = conversion_webhook_crds((crd_dir / "kustomization.yaml").read_text())
        crds = []
        for path in sorted((crd_dir / "bases").glob("*.yaml")):
            crd = yaml.load(path.read_text(), Loader=_LOADER)
            if crd["spec"]["names"]["plural"] in converted:
                crd = with_conversion_webhook(crd, service)
            crds.append(crd)
        hooks = [webhook_to_service(d, service, "kueue-")
                 for d in yaml.load_all((module / "config" / "components" / "webhook" / "manifests.yaml").read_text(), Loader=_LOADER) if d]
        self.log(f"Kueue {pins['KUEUE_VERSION']}: {len(crds)} CRDs, {len(hooks)} webhook configurations and the manager")
        self.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": KUEUE_WEBHOOK_SERVICE, "namespace": KUEUE_NAMESPACE},
             "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"name": "https", "port": port}]}},
            # the empty Secret its certificate management fills (config/components/internalcert/secret.yaml)
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": KUEUE_WEBHOOK_SECRET, "namespace": KUEUE_NAMESPACE}},
            *crds, *hooks,
        ])
        self._wait_crds(*[f"crd/{c['metadata']['name']}" for c in crds])
        certs = self.workdir / "kueue-certs"
        certs.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(kueue_configuration(webhook_port=port, health_port=health, cert_dir=certs)))
        self.run("kueue", [str(self.programs["kueue"]), f"--config={config}", f"--kubeconfig={self.kubeconfig}",
                           "--zap-log-level=info"], NAMESPACE=KUEUE_NAMESPACE)
        # Kueue writes its certificate into the Secret and waits for it to appear in certDir, where the
        # kubelet projects the Secret volume in its pod; no kubelet here, so this process does that part.
        self._mount_secret(KUEUE_NAMESPACE, KUEUE_WEBHOOK_SECRET, certs)
        self.wait("Kueue's /readyz", "kueue",
                  lambda: urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200, timeout=120)
        # its webhooks answer through the API server: a dry-run create of a LocalQueue passes them
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "retool-e2e-probe"}}
        self.wait("Kueue's webhooks called by the API server", "kueue",
                  lambda: self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False).returncode == 0,
                  timeout=60)


def kubectl_binary() -> Path:
    """The kubectl `make helm` fetched into .tools/ (or KUBECTL)."""
    if os.environ.get("KUBECTL"):
        return Path(os.environ["KUBECTL"])
    return Path(__file__).resolve().parents[1] / ".tools" / "kubectl"


@contextlib.contextmanager
def running(workdir: Path, *, log: Callable[[str], None] = lambda _l: None) -> Iterator[ControlPlane]:
    """Build what is missing, start the control plane in ``workdir``, stop it on exit."""
    t0 = time.monotonic()
    programs = build.build_all(log=log)
    built = time.monotonic() - t0
    plane = ControlPlane(workdir, log=log)
    plane.timings["build"] = built
    try:  # a start cut short (a signal, a StartError) stops what it had started
        plane.start(programs)
        yield plane
    finally:
        plane.stop()


class StopSignalError(BaseException):
    """SIGTERM, SIGHUP or SIGINT arrived: unwind so that ``running`` stops every component.

    A ``BaseException``, as ``KeyboardInterrupt`` is: raised by the handler wherever the main thread is,
    it must not be taken for a failed readiness probe (``ControlPlane.wait`` ignores the probe's
    ``Exception``s and polls again). As an ``Exception`` it was, when the signal came during a probe:
    the start went on with every further signal ignored (seen on a loaded machine: SIGINT while
    starting, no exit within 120 s)."""


def _stop_on_signal(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # one signal stops it; more must not cut the stop short
        signal.signal(sig, signal.SIG_IGN)
    raise StopSignalError(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m upstream.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where certificates, etcd data, logs and the kubeconfig go "
                        "(default: a new temporary directory)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="retool-e2e-"))
    if not kubectl_binary().exists():
        print(f"error: {kubectl_binary()} is missing: run `make helm` first (it fetches helm and kubectl)", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _stop_on_signal)
    try:
        with running(workdir, log=lambda line: print(line, flush=True)) as plane:
            print(f"\ncontrol plane up in {plane.timings['total']:.1f} s (build/cache check {plane.timings['build']:.1f} s)")
            print(f"logs:       {workdir / 'logs'}")
            print(f"kubeconfig: {plane.kubeconfig}\n  export KUBECONFIG={plane.kubeconfig}\nCtrl-C stops it.", flush=True)
            try:
                while all(c.alive() for c in plane.components.values()):
                    time.sleep(1)
            except StopSignalError as stop:
                print(f"{stop}: stopping", flush=True)
                return 0
            for c in plane.components.values():
                if not c.alive():
                    print(f"error: {c.name} exited ({c.process.returncode}); last lines of {c.log}:\n{c.tail()}", file=sys.stderr)
            return 1
    except (build.BuildError, StartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StopSignalError as stop:
        print(f"{stop} while starting: stopped what had started", flush=True)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
