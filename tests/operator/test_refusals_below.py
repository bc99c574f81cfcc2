"""What the controllers below the operator refuse (``below``) and the Pod Security level of every pod the
operator renders, checked against the rules of Kubernetes' Pod Security admission."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from retool_operator import below
from retool_operator.builders import build_mlflow
from retool_operator.render import desired_objects
from tests.operator.helpers import CONFIG, T0, document

FORBIDDEN = 'pods "demo-prepare-1-x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
QUOTA = 'pods "demo-sft-1-x" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4'
# What the Job controller and KubeRay record while etcd or the API server restarts (err.Error() of the create).
UNWELL = [
    "etcdserver: request timed out",
    "Timeout: request did not complete within requested timeout - context deadline exceeded",
    "Internal error occurred: resource quota evaluation timed out",
    "the server was unable to return a response in the time allotted, but may still be processing the request (post pods)",
    'Post "https://127.0.0.1:6443/api/v1/namespaces/demo/pods": dial tcp 127.0.0.1:6443: connect: connection refused',
]


def event(reason: str, message: str, when: str, type_: str = "Warning") -> dict[str, Any]:
    return {"reason": reason, "message": message, "type": type_, "lastTimestamp": when}


CHILD_CASES = [
    (
        "kuberay's ReplicaFailure condition names the refused head pod",
        "RayJob",
        {
            "status": {
                "jobDeploymentStatus": "Initializing",
                "rayClusterStatus": {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod", "message": FORBIDDEN}]},
            }
        },
        None,
        "KubeRay cannot create the pods of RayJob demo-sft-1: FailedCreateHeadPod: " + FORBIDDEN,
    ),
    ("a cleared ReplicaFailure says nothing", "RayJob", {"status": {"rayClusterStatus": {"conditions": [{"type": "ReplicaFailure", "status": "False"}]}}}, None, None),
    (
        "the newest FailedCreate Event of a Job is its reason",
        "Job",
        {"status": {}},
        [event("FailedCreate", "Error creating: " + QUOTA, "2026-01-01T00:00:00Z"), event("FailedCreate", "Error creating: " + FORBIDDEN, "2026-01-01T00:05:00Z")],
        "the Job controller cannot create the pod of Job demo-sft-1: Error creating: " + FORBIDDEN,
    ),
    (
        "a webhook's denial is a refusal",
        "Job",
        {"status": {}},
        [event("FailedCreate", 'Error creating: admission webhook "policy.example.dev" denied the request: no GPUs on weekends', "2026-01-01T00:00:00Z")],
        'the Job controller cannot create the pod of Job demo-sft-1: Error creating: admission webhook "policy.example.dev" denied the request: no GPUs on weekends',
    ),
    (
        "a refusal followed by a control-plane timeout is no refusal now (the newest Event speaks)",
        "Job",
        {"status": {}},
        [event("FailedCreate", "Error creating: " + QUOTA, "2026-01-01T00:00:00Z"), event("FailedCreate", "Error creating: etcdserver: request timed out", "2026-01-01T00:05:00Z")],
        None,
    ),
    ("normal Events of a Job are no refusal", "Job", {"status": {}}, [event("SuccessfulCreate", "Created pod", "2026-01-01T00:00:00Z", "Normal")], None),
]


@pytest.mark.parametrize(("kind", "obj", "events", "expected"), [c[1:] for c in CHILD_CASES], ids=[c[0] for c in CHILD_CASES])
def test_child_refusal(kind: str, obj: dict[str, Any], events: list[dict[str, Any]] | None, expected: str | None) -> None:
    assert below.child_refusal(kind, "demo-sft-1", obj, events, T0) == expected


SA_MISSING = 'pods "demo-prepare-1-x" is forbidden: error looking up service account demo/default: serviceaccount "default" not found'


def stamp(seconds_before_t0: float) -> str:
    return (T0 - dt.timedelta(seconds=seconds_before_t0)).strftime("%Y-%m-%dT%H:%M:%SZ")


def failed(message: str, seconds_before_t0: float) -> dict[str, Any]:
    return event("FailedCreate", "Error creating: " + message, stamp(seconds_before_t0))


def created(seconds_before_t0: float) -> dict[str, Any]:
    return event("SuccessfulCreate", "Created pod: demo-prepare-1-x", stamp(seconds_before_t0), "Normal")


CREATION_CASES = [
    # (what, events, refused): the Job controller's FailedCreate / SuccessfulCreate Events (pkg/controller/controller_utils.go, Kubernetes v1.36.3).
    ("refused and never created", [failed(QUOTA, 30)], True),
    ("refused, then the retry created the pod", [failed(SA_MISSING, 30), created(28)], False),
    ("created, then the replacement refused", [created(60), failed(QUOTA, 30)], True),
    ("created in the same second as the refusal: the retry got through", [failed(SA_MISSING, 30), created(30)], False),
    (
        "microsecond eventTimes compared as times (series Events)",
        [{"reason": "SuccessfulCreate", "type": "Normal", "message": "Created pod: x", "eventTime": "2026-01-01T00:00:06.100000Z"},
         {"reason": "FailedCreate", "type": "Warning", "message": "Error creating: " + QUOTA, "eventTime": "2026-01-01T00:00:06.523186Z"}],
        True,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("events", "refused"), [c[1:] for c in CREATION_CASES], ids=[c[0] for c in CREATION_CASES])
def test_a_refusal_the_job_controllers_retry_got_past_is_no_refusal(events: list[dict[str, Any]], refused: bool) -> None:
    """A Job whose pod has just ended has no active pod until its controller marks it finished; an early
    refusal (a fresh namespace's ServiceAccount not made yet) still in its Events is not a refusal now."""
    found = below.child_refusal("Job", "demo-prepare-1", {"status": {}}, events, T0)
    assert (found is not None) == refused, found
    assert (below.submitter_refusal("demo-sft-1", {"status": {}}, {"spec": {}, "status": {}}, events, T0) is not None) == refused


def test_a_replica_failure_is_a_refusal_once_it_has_held_for_the_read_interval() -> None:
    """The Deployment and KubeRay controllers retry a refused pod: a ReplicaFailure that clears within
    seconds (the ServiceAccount admission in a namespace created a moment before) is not shown."""

    def deployment(seconds: float) -> dict[str, Any]:
        cond = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": SA_MISSING, "lastTransitionTime": stamp(seconds)}
        return {"status": {"conditions": [cond]}}

    fresh, held = deployment(below.EVENTS_AFTER_SECONDS - 2), deployment(below.EVENTS_AFTER_SECONDS)
    assert below.replica_failure(fresh, T0) is None and below.replicas_refusal_settling(fresh, T0)
    assert below.replica_failure(held, T0) == f"FailedCreate {SA_MISSING}" and not below.replicas_refusal_settling(held, T0)
    rayjob = {"status": {"rayClusterStatus": {"conditions": [{**deployment(1)["status"]["conditions"][0], "reason": "FailedCreateHeadPod"}]}}}
    assert below.child_refusal("RayJob", "demo-sft-1", rayjob, None, T0) is None
    rayjob["status"]["rayClusterStatus"]["conditions"][0]["lastTransitionTime"] = stamp(below.EVENTS_AFTER_SECONDS)
    assert below.child_refusal("RayJob", "demo-sft-1", rayjob, None, T0) is not None


def kueue_denial(kind: str, name: str) -> str:
    """Kueue's pod webhook while its cache has not seen the pod's owner (seen in CI after an etcd restart)."""
    return f'admission webhook "mpod.kb.io" denied the request: {kind} "{name}" not found'


def denied_since(message: str, first: float, last: float) -> dict[str, Any]:
    return {**failed(message, last), "firstTimestamp": stamp(first), "count": 3}


STALE = below.STALE_CACHE_SECONDS
OWNER_CASES = [
    # (what, events, refused)
    ("the webhook cannot find the Job itself, for seconds: its cache lags", [denied_since(kueue_denial("Job.batch", "demo-prepare-1"), 20, 2)], False),
    ("... and still, a minute on: shown", [denied_since(kueue_denial("Job.batch", "demo-prepare-1"), STALE, 2)], True),
    ("... the same answer since a minute, retried rarely: shown", [denied_since(kueue_denial("Job.batch", "demo-prepare-1"), STALE + 1, STALE + 1)], True),
    ("the webhook cannot find another Job: a refusal now", [denied_since(kueue_denial("Job.batch", "someone-else"), 20, 2)], True),
    ("the webhook cannot find the namespace's policy object: a refusal now", [denied_since(kueue_denial("ConfigMap", "demo-prepare-1"), 20, 2)], True),
    ("a Forbidden that says not found is no webhook's cache", [denied_since(SA_MISSING, 20, 2)], True),
]  # fmt: skip


@pytest.mark.parametrize(("events", "refused"), [c[1:] for c in OWNER_CASES], ids=[c[0] for c in OWNER_CASES])
def test_a_webhook_that_has_not_seen_the_pods_owner_yet_is_given_a_minute(events: list[dict[str, Any]], refused: bool) -> None:
    found = below.child_refusal("Job", "demo-prepare-1", {"status": {}}, events, T0)
    assert (found is not None) == refused, found


def test_the_submitter_and_the_ray_pods_are_given_the_same_minute() -> None:
    """KubeRay names the submitter Job as its RayJob; the Ray pods' owner chain is RayCluster, then RayJob."""
    submitter = {"metadata": {"name": "demo-sft-1"}, "spec": {}, "status": {}}
    for kind, name in (("Job.batch", "demo-sft-1"), ("RayJob.ray.io", "demo-sft-1")):
        lagging, stuck = [denied_since(kueue_denial(kind, name), 20, 2)], [denied_since(kueue_denial(kind, name), STALE, 2)]
        assert below.submitter_refusal("demo-sft-1", {"status": {}}, submitter, lagging, T0) is None
        assert below.submitter_refusal("demo-sft-1", {"status": {}}, submitter, stuck, T0) is not None
    for kind, name in (("RayCluster.ray.io", "demo-sft-1-raycluster-abcde"), ("RayJob.ray.io", "demo-sft-1")):
        for held, refused in ((below.EVENTS_AFTER_SECONDS + 5, False), (STALE, True)):
            cond = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod", "message": kueue_denial(kind, name), "lastTransitionTime": stamp(held)}
            rayjob = {"status": {"rayClusterName": "demo-sft-1-raycluster-abcde", "rayClusterStatus": {"conditions": [cond]}}}
            assert (below.child_refusal("RayJob", "demo-sft-1", rayjob, None, T0) is not None) == refused, (kind, held)


@pytest.mark.parametrize("message", UNWELL)
def test_a_control_plane_that_is_unwell_refuses_nothing(message: str) -> None:
    """etcd or the API server restarting fails the controllers' creations with these: they retry, the run is not refused."""
    job_events = [event("FailedCreate", f"Error creating: {message}", "2026-01-01T00:00:00Z")]
    assert below.child_refusal("Job", "demo-prepare-1", {"status": {}}, job_events, T0) is None
    replica = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod", "message": message}
    assert below.child_refusal("RayJob", "demo-sft-1", {"status": {"rayClusterStatus": {"conditions": [replica]}}}, None, T0) is None
    assert below.replica_failure({"status": {"conditions": [{**replica, "reason": "FailedCreate"}]}}, T0) is None
    submitter = {"spec": {}, "status": {}}
    assert below.submitter_refusal("demo-sft-1", {"status": {}}, submitter, job_events, T0) is None
    assert below.submitter_refusal("demo-sft-1", {"status": {}}, submitter, [event("FailedCreate", "Error creating: " + QUOTA, "2026-01-01T00:00:00Z")], T0) is not None


@pytest.mark.parametrize(
    ("obj", "asked"),
    [
        ({"spec": {}, "status": {}}, True),
        ({"spec": {}, "status": {"active": 1}}, False),
        ({"spec": {"suspend": True}, "status": {}}, False),
        ({"spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, False),
        ({"spec": {"completions": 1}, "status": {"succeeded": 1}}, False),
        ({"spec": {"completions": 1, "backoffLimit": 1}, "status": {"failed": 1}}, True),
    ],
    ids=["no-pod-yet-ask-why", "a-pod-runs", "suspended-by-its-queue", "finished", "succeeded-not-yet-marked-complete", "failed-replacement-not-created"],
)
def test_events_are_read_only_for_a_job_that_should_have_a_pod_and_has_none(obj: dict[str, Any], asked: bool) -> None:
    assert below.job_without_pods(obj) is asked


def test_a_pending_claim_names_its_provisioning_failure_and_a_bound_one_does_not() -> None:
    failed = [event("ProvisioningFailed", 'failed to provision volume with StorageClass "block": ReadWriteMany not supported', "2026-01-01T00:00:00Z")]
    pending = {"status": {"phase": "Pending"}}
    assert below.claim_refusal("demo-data", pending, failed) == (
        'PersistentVolumeClaim demo-data cannot be provisioned: failed to provision volume with StorageClass "block": ReadWriteMany not supported'
    )
    assert below.claim_refusal("demo-data", {"status": {"phase": "Bound"}}, failed) is None
    assert below.claim_refusal("demo-data", pending, []) is None


# ---------------------------------------------------------------- Pod Security levels


def pod_specs(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every pod template in an object the operator renders."""
    spec = obj.get("spec") or {}
    out = []
    if obj["kind"] in ("Job", "Deployment"):
        out.append((obj["kind"], spec["template"]["spec"]))
    if obj["kind"] == "RayJob":
        cluster = spec["rayClusterSpec"]
        out.append(("head", cluster["headGroupSpec"]["template"]["spec"]))
        out += [(g["groupName"], g["template"]["spec"]) for g in cluster.get("workerGroupSpecs") or []]
        out.append(("submitter", spec["submitterPodTemplate"]["spec"]))
    return out


BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def baseline_problems(pod: dict[str, Any]) -> list[str]:
    """The ``baseline`` checks of pkg/security/podsecurity/policy (Kubernetes v1.36.3) that a rendered pod can fail."""
    problems = []
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        problems.append("host namespaces")
    problems += [f"hostPath volume {v['name']}" for v in pod.get("volumes") or [] if "hostPath" in v]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{container['name']}: privileged")
        added = set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        if added:
            problems.append(f"{container['name']}: capabilities {sorted(added)}")
    return problems


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """``restricted`` = ``baseline`` plus its own checks (same package)."""
    problems = baseline_problems(pod)
    pod_context = pod.get("securityContext") or {}
    problems += [f"volume type of {v['name']}" for v in pod.get("volumes") or [] if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{container['name']}: allowPrivilegeEscalation != false")
        if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{container['name']}: capabilities.drop does not include ALL")
        if not (context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))):
            problems.append(f"{container['name']}: runAsNonRoot != true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{container['name']}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{container['name']}: seccompProfile")
    return problems


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-node", "two-nodes"])
def test_every_nvidia_stage_pod_meets_pod_security_restricted(nodes: int) -> None:
    doc = document(hardware={"nodes": nodes}, storage={"pvc": {}})
    for obj in desired_objects(doc, config=CONFIG):
        if obj["kind"] in ("Job", "RayJob"):
            for where, pod in pod_specs(obj):
                assert restricted_problems(pod) == [], f"{obj['metadata']['name']} {where}"


def test_every_ascend_stage_pod_meets_baseline() -> None:
    """The Ascend trainer image runs as root (its CANN runtime): ``baseline`` is its documented level."""
    doc = document(hardware={"accelerator": "ascend", "nodes": 2}, storage={"pvc": {}})
    for obj in desired_objects(doc, config=CONFIG):
        if obj["kind"] in ("Job", "RayJob"):
            for where, pod in pod_specs(obj):
                assert baseline_problems(pod) == [], f"{obj['metadata']['name']} {where}"


def test_the_managed_mlflow_pod_meets_restricted() -> None:
    deployment = next(o for o in build_mlflow("ml", config=CONFIG) if o["kind"] == "Deployment")
    assert restricted_problems(deployment["spec"]["template"]["spec"]) == []
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000


def test_the_restricted_check_can_fail() -> None:
    pod = {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    problems = restricted_problems(pod)
    assert "hostPath volume h" in problems and "c: capabilities ['SYS_ADMIN']" in problems and "c: allowPrivilegeEscalation != false" in problems


def test_events_are_read_only_for_objects_that_are_not_brand_new() -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
    assert below.old_enough({"metadata": {"creationTimestamp": "2026-01-01T12:00:00Z"}}, now)
    assert not below.old_enough({"metadata": {"creationTimestamp": "2026-01-01T12:00:25Z"}}, now)
    assert below.old_enough({"metadata": {}}, now)
