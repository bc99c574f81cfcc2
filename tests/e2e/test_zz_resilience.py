"""The operator on a bad day, against the real control plane: the API server throttling it (API Priority
and Fairness), its watches expiring (410 Gone) across a kube-apiserver restart, etcd restarted mid stage,
the operator killed between creating a child and writing status, and its token revoked.

Each scenario ends with the run converged: the next stage running, one child per attempt, the attempt
counts as they were, and every child owned by its run (no orphan). The restarts act on the session's
control plane and wait until it serves again (``ControlPlane.restart``). The file is named to run last of
tests/e2e (one worker runs the directory file after file, in name order): after an API server or etcd
restart the controllers' own recovery (KubeRay's, the scheduler's) is not something later modules
should depend on; a module that ran after it once saw KubeRay create no head pod within 2 minutes.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retool_operator.kube import KINDS, ApiError, Credentials, KubeClient
from tests.e2e.conftest import RELEASE_NAMESPACE, Cluster, eventually, run_manifest

LABEL_RUN = "retool.dev/run"
CONFIGMAPS = KINDS[("v1", "ConfigMap")]


def run_jobs(kube: Cluster, namespace: str, run: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in kube.items("jobs", namespace, "-l", f"{LABEL_RUN}={run}"))


def assert_no_orphans(kube: Cluster, namespace: str, run: str) -> None:
    """Every object carrying the run's label is owned by the run (its current uid): nothing is left behind."""
    uid = kube.get("retoolrun", run, namespace)["metadata"]["uid"]
    for kind in ("jobs", "rayjobs", "configmaps", "deployments", "services"):
        for obj in kube.items(kind, namespace, "-l", f"{LABEL_RUN}={run}"):
            owners = [ref for ref in obj["metadata"].get("ownerReferences", []) if ref.get("kind") == "RetoolRun"]
            assert [ref["uid"] for ref in owners] == [uid], f"{kind}/{obj['metadata']['name']} is not owned by run {run}: {owners}"


def walk_prepare(kube: Cluster, namespace: str, run: str, *, timeout: float = 90) -> None:
    """End the run's prepare pod; the run must then be in preflight, attempt 1 of each, one Job per attempt."""
    kube.finish_pods(f"{run}-prepare-1", namespace, 0, timeout=timeout)
    preflight = kube.wait_stage(run, namespace, "preflight", "Running", timeout=timeout)
    prepare = kube.stage(run, namespace, "prepare")
    assert (prepare["state"], prepare["attempt"], preflight["attempt"], preflight["job"]) == ("Succeeded", 1, 1, f"{run}-preflight-1")
    assert run_jobs(kube, namespace, run) == [f"{run}-preflight-1", f"{run}-prepare-1"], "a duplicate or missing child"
    assert_no_orphans(kube, namespace, run)


def never_refused(kube: Cluster, namespace: str, run: str) -> None:
    status = kube.run_status(run, namespace)
    text = json.dumps(status)
    assert not re.search(r"refused|TooManyRequests|\b429\b", text), f"run {run} shows a refusal: {text[:2000]}"
    refusals = [e.get("message") for e in kube.events(namespace, run) if e.get("reason") == "ChildRefused"]
    assert not refusals, f"run {run} was shown a refusal in its Events: {refusals} (operator log:\n{kube.operator.tail(40)}\n)"


@pytest.fixture
def operator_resync(kube: Cluster) -> Iterator[Any]:
    """Restart the operator with another resync interval; the session's (5 s) is back afterwards."""
    operator = kube.operator
    before = operator.env["RETOOL_OPERATOR_RESYNC_SECONDS"]

    def restart_with(seconds: int) -> None:
        operator.stop()
        operator.env["RETOOL_OPERATOR_RESYNC_SECONDS"] = str(seconds)
        operator.start()

    yield restart_with
    if operator.env["RETOOL_OPERATOR_RESYNC_SECONDS"] != before:
        restart_with(int(before))


# ---------------------------------------------------------------- throttling


THROTTLE = "retool-e2e-throttle"


def throttle_config(service_account: str) -> list[dict[str, Any]]:
    """API Priority and Fairness (flowcontrol.apiserver.k8s.io/v1) giving the operator's ServiceAccount one
    seat and rejecting what does not fit (429 with Retry-After), as a busy shared cluster does to a
    low-priority client. Seats are shared out by nominalConcurrencyShares over the server's 600 (400 +
    200 in-flight): a level that nobody uses with 2000 shares (all lendable, so the cluster's own levels
    borrow them) leaves ceil(600 * 1 / 2246) = 1 seat to the throttled level, which neither lends nor borrows."""
    api = "flowcontrol.apiserver.k8s.io/v1"
    limited = {"nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}
    ballast = {"nominalConcurrencyShares": 2000, "lendablePercent": 100, "limitResponse": {"type": "Reject"}}
    everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
    return [
        {"apiVersion": api, "kind": "PriorityLevelConfiguration", "metadata": {"name": THROTTLE}, "spec": {"type": "Limited", "limited": limited}},
        {"apiVersion": api, "kind": "PriorityLevelConfiguration", "metadata": {"name": f"{THROTTLE}-ballast"}, "spec": {"type": "Limited", "limited": ballast}},
        {"apiVersion": api, "kind": "FlowSchema", "metadata": {"name": THROTTLE}, "spec": {
            "priorityLevelConfiguration": {"name": THROTTLE}, "matchingPrecedence": 500, "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": service_account, "namespace": RELEASE_NAMESPACE}}],
                       "resourceRules": [everything], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}},
    ]  # fmt: skip


def rejected(kube: Cluster) -> int:
    """Requests API Priority and Fairness rejected for the throttled level (kube-apiserver's /metrics)."""
    code, text = kube.plane.https_get("/metrics")
    assert code == 200, text[:300]
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_rejected_requests_total{") and f'priority_level="{THROTTLE}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_a_throttled_operator_backs_off_and_every_run_converges_without_a_refusal(kube: Cluster, namespace: str) -> None:
    docs = throttle_config(kube.release["service_account"])
    assert kube.apply({"apiVersion": "v1", "kind": "List", "items": docs}).returncode == 0
    try:
        eventually("the FlowSchema bound to its priority level",
                   lambda: any(c["type"] == "Dangling" and c["status"] == "False"
                               for c in ((kube.get("flowschema", THROTTLE, "default") or {}).get("status") or {}).get("conditions", [])))
        runs = [f"busy-{i}" for i in range(4)]
        items = [run_manifest(run, namespace) for run in runs]
        assert kube.apply({"apiVersion": "v1", "kind": "List", "items": items}).returncode == 0  # four first passes at once
        for run in runs:
            kube.wait_stage(run, namespace, "prepare", "Running", timeout=120)
        for run in runs:
            walk_prepare(kube, namespace, run, timeout=120)
        throttled = rejected(kube)
    finally:
        for doc in reversed(docs):
            kube.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False)
    assert throttled > 0, "the API server never throttled the operator: the scenario tested nothing"
    for run in runs:
        never_refused(kube, namespace, run)
    assert "HTTP 429; trying again" in kube.operator.log.read_text(errors="replace"), "the operator's client never backed off"
    assert kube.operator.process.poll() is None


# ---------------------------------------------------------------- restarts


def test_a_kube_apiserver_restart_with_etcd_compacted_expires_the_watches_and_the_operator_relists(
    kube: Cluster, namespace: str, operator_resync: Any
) -> None:
    """The resync timer is set to 10 minutes: after the restart only the operator's watches (resumed from
    a compacted resource version, so answered 410 Gone, then listed again) can tell it the prepare Job finished."""
    operator_resync(600)
    assert kube.apply(run_manifest("relist", namespace)).returncode == 0
    kube.wait_stage("relist", namespace, "prepare", "Running", timeout=90)
    seen = kube.get("job", "relist-prepare-1", namespace)["metadata"]["resourceVersion"]
    compacted: list[int] = []
    kube.plane.restart("kube-apiserver", while_down=lambda: compacted.append(kube.plane.etcd_compact()))
    assert compacted[0] > int(seen)
    answer = kube.kubectl("get", "--raw", f"/apis/batch/v1/namespaces/{namespace}/jobs?watch=1&resourceVersion={seen}&timeoutSeconds=2",
                          check=False, timeout=30)
    assert '"code":410' in answer.stdout.replace(" ", ""), f"a watch from before the compaction was not expired: {answer.stdout[:300]} {answer.stderr[:300]}"
    walk_prepare(kube, namespace, "relist", timeout=120)
    assert kube.operator.process.poll() is None, "the operator died on the expired watch"


def test_etcd_restarted_mid_stage(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("etcd-down", namespace)).returncode == 0
    kube.wait_stage("etcd-down", namespace, "prepare", "Running", timeout=90)

    def until_the_api_server_notices() -> None:
        eventually("kube-apiserver reporting etcd down", lambda: kube.plane.https_get("/readyz")[0] not in (0, 200), timeout=60)

    kube.plane.restart("etcd", while_down=until_the_api_server_notices)
    walk_prepare(kube, namespace, "etcd-down", timeout=120)
    never_refused(kube, namespace, "etcd-down")
    assert kube.operator.process.poll() is None


def test_the_operator_killed_between_creating_a_child_and_writing_status(kube: Cluster, namespace: str) -> None:
    """A ValidatingAdmissionPolicy holds the run's status writes, so the operator's pass creates the prepare
    Job and then cannot record it; the operator is then killed (SIGKILL). The restarted operator finds the
    Job (409 on create), names it in the status as attempt 1, and creates no second one."""
    policy = f"hold-status-{namespace}"
    docs = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": policy}, "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["retool.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
                                                    "resources": ["retoolruns/status"]}]},
            "validations": [{"expression": "false", "message": "status writes are held by the test"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy}, "spec": {
            "policyName": policy, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]  # fmt: skip
    run = run_manifest("killed", namespace, suspend=True)  # created suspended: the policy is checked before anything starts
    assert kube.apply(run).returncode == 0
    assert kube.apply({"apiVersion": "v1", "kind": "List", "items": docs}).returncode == 0
    restarted = False
    try:
        probe = ["patch", "retoolrun", "killed", "-n", namespace, "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Pending"}}', "--dry-run=server"]
        eventually("the policy holding status writes", lambda: "status writes are held" in kube.kubectl(*probe, check=False).stderr)
        kube.kubectl("patch", "retoolrun", "killed", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
        eventually("the prepare Job created", lambda: kube.get("job", "killed-prepare-1", namespace))
        eventually("the operator's status write refused", lambda: "status writes are held by the test" in kube.operator.log.read_text(errors="replace"))
        assert not [s for s in kube.run_status("killed", namespace).get("stages", []) if s.get("job")], "the status names a child: nothing was interrupted"
        kube.operator.kill()
        kube.kubectl("delete", "validatingadmissionpolicybinding", policy)
        kube.operator.start()
        restarted = True
    finally:
        for doc in reversed(docs):
            kube.kubectl("delete", doc["kind"].lower(), policy, "--ignore-not-found", check=False)
        if not restarted and kube.operator.process.poll() is not None:
            kube.operator.start()
    prepare = kube.wait_stage("killed", namespace, "prepare", "Running", timeout=90)
    assert (prepare["attempt"], prepare["job"]) == (1, "killed-prepare-1")
    assert run_jobs(kube, namespace, "killed") == ["killed-prepare-1"]
    walk_prepare(kube, namespace, "killed")


# ---------------------------------------------------------------- token rotation


async def test_a_revoked_token_is_refused_and_the_client_recovers_once_the_file_holds_a_new_one(kube: Cluster, namespace: str, tmp_path: Path) -> None:
    """The operator's client against the real authenticator: a token bound to a Secret stops working
    once the Secret is deleted (401), and the next request after the token file changes succeeds, with
    no new client (the kubelet rotates the projected token file the same way)."""
    kube.kubectl("create", "serviceaccount", "rotating", "-n", namespace)
    kube.kubectl("create", "rolebinding", "rotating-view", "-n", namespace, "--clusterrole=view", f"--serviceaccount={namespace}:rotating")

    def bound_token(secret: str) -> str:
        kube.kubectl("create", "secret", "generic", secret, "-n", namespace)
        return kube.kubectl("create", "token", "rotating", "-n", namespace, "--bound-object-kind=Secret",
                            f"--bound-object-name={secret}", "--duration=1h").stdout.strip()

    token_file = tmp_path / "token"
    token_file.write_text(bound_token("holder-1"))
    client = KubeClient(Credentials(server=kube.plane.server, ca_path=str(kube.plane.ca.cert_path), token_path=str(token_file)))
    try:
        assert await client.get(CONFIGMAPS, namespace, "kube-root-ca.crt") is not None
        kube.kubectl("delete", "secret", "holder-1", "-n", namespace)
        revoked = time.monotonic()
        deadline = revoked + 90
        status = None
        while time.monotonic() < deadline and status != 401:
            try:
                await client.get(CONFIGMAPS, namespace, "kube-root-ca.crt")
            except ApiError as err:
                status = err.status
            else:
                await asyncio.sleep(0.5)
        assert status == 401, "the revoked token still worked after 90 s"
        token_file.write_text(bound_token("holder-2"))
        assert await client.get(CONFIGMAPS, namespace, "kube-root-ca.crt") is not None  # the new token, read at once
    finally:
        await client.close()
