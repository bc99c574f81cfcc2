"""The sandbox Deployment as deployed: spec.sandbox.isolation and runtimeClassName, the pod shape of
user-namespace mode and of the non-root fallback, and the operator's way in through the NetworkPolicy.

The Kubernetes semantics these shapes rely on are written down here as checks (``pss_violations``
and the user-namespace rules) so a change to a shape that would break them fails a test, not a
cluster: Pod Security Standards controls (kubernetes.io/docs/concepts/security/pod-security-standards),
the user-namespace limits (kubernetes.io/docs/concepts/workloads/pods/user-namespaces), and the
RuntimeDefault seccomp profile's rule that namespace syscalls need CAP_SYS_ADMIN.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from retool.sandbox.settings import SandboxSettings
from retool.spec.model import SANDBOX_MAX_WORKERS
from retool_operator import builders
from retool_operator.builders.sandbox_security import NAMESPACE_CAPABILITY, USERNS_CAPABILITIES
from retool_operator.render import desired_objects
from tests.operator.helpers import CONFIG, document, run_of
from tests.operator.test_manifests import problems_of, ray_schemas  # noqa: F401  (fixture)

USERNS = CONFIG.model_copy(update={"sandbox_user_namespaces": True})
USERNS_BASELINE = CONFIG.model_copy(update={"sandbox_user_namespaces": True, "sandbox_sys_admin": False})
WITH_OPERATOR = CONFIG.model_copy(
    update={"own_namespace": "retool-system", "own_pod_selector": "app.kubernetes.io/name=retool,app.kubernetes.io/component=operator"}
)

# Pod Security Standards, the controls that concern these pods.
BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)
USERNS_VOLUME_TYPES = frozenset({"configMap", "secret", "projected", "downwardAPI", "emptyDir"})
"""The volume types the user-namespace documentation lists as supported for hostUsers: false pods."""
KUBELET_USERNS_IDS = 65536
"""The kubelet maps uids/gids 0-65535 of a hostUsers: false pod (runAsUser and friends must fall inside)."""


def pss_violations(pod: dict[str, Any], level: str) -> list[str]:
    """What the ``baseline`` or ``restricted`` Pod Security Standard refuses in ``pod`` (a pod spec)."""
    found: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(key)
    pod_sc = pod.get("securityContext") or {}
    for c in pod["containers"]:
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if sc.get("privileged"):
            found.append(f"{c['name']}: privileged")
        if added - BASELINE_CAPABILITIES:
            found.append(f"{c['name']}: capabilities {sorted(added - BASELINE_CAPABILITIES)} beyond baseline")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"{c['name']}: procMount")
        if level == "restricted":
            if sc.get("allowPrivilegeEscalation") is not False:
                found.append(f"{c['name']}: allowPrivilegeEscalation")
            if "ALL" not in (caps.get("drop") or []) or added - {"NET_BIND_SERVICE"}:
                found.append(f"{c['name']}: capabilities must drop ALL and add at most NET_BIND_SERVICE")
            if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
                found.append(f"{c['name']}: runAsNonRoot")
            if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
                found.append(f"{c['name']}: runAsUser 0")
            profile = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
            if profile not in ("RuntimeDefault", "Localhost"):
                found.append(f"{c['name']}: seccompProfile")
    return found


def sandbox_pod(config: Any = CONFIG, **spec: Any) -> dict[str, Any]:
    return builders.build_sandbox_deployment(run_of(**spec), config=config, replicas=1)["spec"]["template"]["spec"]


def env_of(pod: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("sandbox", "require", "runtime_class"),
    [({"isolation": "strict", "runtimeClassName": "gvisor"}, True, "gvisor"), ({}, False, None)],
    ids=["strict makes a replica refuse to be ready without strong isolation, under its RuntimeClass", "auto serves and reports"],
)
def test_the_servers_own_settings_read_what_the_deployment_sets(
    sandbox: dict[str, Any], require: bool, runtime_class: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("RETOOL_SANDBOX_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(sandbox_pod(sandbox=sandbox)).items():
        if value is not None:
            monkeypatch.setenv(name, value)
    settings = SandboxSettings(_env_file=None)
    assert (settings.require_isolation, settings.runtime_class) == (require, runtime_class)
    assert settings.max_run_timeout_s == 30 and settings.tmp_root == "/tmp"


def test_runtime_class_goes_on_the_pod_and_into_the_servers_report() -> None:
    pod = sandbox_pod(sandbox={"runtimeClassName": "gvisor"})
    assert pod["runtimeClassName"] == "gvisor"
    assert env_of(pod)["RETOOL_SANDBOX_RUNTIME_CLASS"] == "gvisor"
    plain = sandbox_pod()
    assert "runtimeClassName" not in plain and "RETOOL_SANDBOX_RUNTIME_CLASS" not in env_of(plain)


def test_the_fallback_is_the_restricted_non_root_pod() -> None:
    pod = sandbox_pod()
    assert "hostUsers" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == builders.SANDBOX_RUN_AS_USER
    assert pss_violations(pod, "restricted") == []


def test_user_namespace_mode_runs_root_of_the_pods_own_user_namespace_with_namespaced_capabilities() -> None:
    pod = sandbox_pod(USERNS)
    sc = pod["containers"][0]["securityContext"]
    assert pod["hostUsers"] is False
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
    assert pod["securityContext"]["runAsNonRoot"] is False  # a pod-level True would refuse uid 0 at container start
    assert set(sc["capabilities"]["add"]) == {NAMESPACE_CAPABILITY, *USERNS_CAPABILITIES}
    assert sc["capabilities"]["drop"] == ["ALL"]
    # RuntimeDefault stays: it lets unshare/setns/mount through because the container holds SYS_ADMIN.
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    # The API refuses the CAP_ spelling of SYS_ADMIN together with allowPrivilegeEscalation: false.
    assert not any(cap.startswith("CAP_") for cap in sc["capabilities"]["add"])


@pytest.mark.parametrize(
    ("config", "baseline"),
    [(USERNS, False), (USERNS_BASELINE, True)],
    ids=["with SYS_ADMIN the pod needs the privileged level", "without it baseline admits the pod"],
)
def test_user_namespace_pods_and_pod_security_levels(config: Any, baseline: bool) -> None:
    pod = sandbox_pod(config)
    assert (pss_violations(pod, "baseline") == []) is baseline
    assert pss_violations(pod, "restricted") != []  # restricted never admits root (without the alpha UserNamespacesPodSecurityStandards gate)


def test_user_namespace_pods_keep_to_what_host_users_false_allows() -> None:
    pod = sandbox_pod(USERNS)
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= USERNS_VOLUME_TYPES, volume
    # Every uid the server hands out (UID_BASE + slot, at most SANDBOX_MAX_WORKERS slots) is inside the range the kubelet maps.
    top_uid = SandboxSettings(_env_file=None).uid_base + SANDBOX_MAX_WORKERS - 1
    assert top_uid < KUBELET_USERNS_IDS
    # A private /proc per worker needs an unmasked /proc: set where the pod is privileged anyway
    # (SYS_ADMIN), never in the baseline shape (baseline refuses Unmasked before 1.35).
    assert pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"
    assert "procMount" not in sandbox_pod(USERNS_BASELINE)["containers"][0]["securityContext"]


@pytest.mark.parametrize(
    "config",
    [CONFIG, USERNS, USERNS_BASELINE, WITH_OPERATOR],
    ids=["non-root fallback", "user namespaces", "user namespaces without SYS_ADMIN", "operator admitted by the policy"],
)
def test_every_shape_is_a_valid_manifest(config: Any, ray_schemas: dict, tmp_path: Path) -> None:  # noqa: F811
    doc = document(sandbox={"isolation": "strict", "runtimeClassName": "gvisor"})
    objects = [o for o in desired_objects(doc, config=config) if o["kind"] in ("Deployment", "NetworkPolicy", "Service", "PodDisruptionBudget")]
    assert len(objects) == 4
    assert problems_of(objects, ray_schemas, tmp_path) == []


def test_the_network_policy_admits_the_operator_pods_only_when_the_deployment_names_them() -> None:
    run = run_of(name="alpha")
    without = builders.build_sandbox(run, config=CONFIG, replicas=1)[1]
    assert len(without["spec"]["ingress"]) == 1  # only the run's stage pods
    policy = builders.build_sandbox(run, config=WITH_OPERATOR, replicas=1)[1]
    assert policy["kind"] == "NetworkPolicy"
    rule = policy["spec"]["ingress"][-1]
    # One peer with both selectors: pods with these labels AND in that namespace (two peers would OR them).
    assert rule == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "retool-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "retool", "app.kubernetes.io/component": "operator"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    assert "egress" not in policy["spec"]


def test_the_user_namespace_shape_grants_what_the_sandbox_tests_run_with() -> None:
    """tests/sandbox proves the isolation of a server started as ``podlike``'s k8s-userns kind (root of
    a user namespace with exactly these capabilities, no_new_privs): the operator grants the same."""
    from tests.sandbox import podlike

    sc = sandbox_pod(USERNS)["containers"][0]["securityContext"]
    assert set(sc["capabilities"]["add"]) == {cap.upper() for cap in podlike.K8S_USERNS_CAPS}
    assert sc["allowPrivilegeEscalation"] is False and sc["runAsUser"] == 0


@pytest.mark.slow
def test_a_server_in_that_shape_reports_namespaces_and_own_uids_to_the_operator() -> None:
    """A real server started as the user-namespace pod runs (tests/sandbox/podlike.py): its /readyz, read
    through the operator's parser, is strong with per-worker namespaces and a uid per execution, and
    it is not flagged as root of the node (it is root of its own user namespace only)."""
    import httpx

    from retool_operator.isolation import parse_readyz
    from tests.sandbox.conftest import start_server, stop_server

    server = start_server(1, kind="k8s-userns")
    try:
        report = parse_readyz("pod", httpx.get(f"{server.url}/readyz", timeout=10).json())
    finally:
        stop_server(server)
    assert report.strong is True and report.root_on_node is False
    assert report.mode == "root-namespaces"
    assert {"uid-per-execution", "pid-namespace", "network-namespace", "mount-namespace"} <= set(report.layers)
