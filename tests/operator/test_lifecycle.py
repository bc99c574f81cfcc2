"""The rendered children against what KubeRay, the kubelet and the API server do with them.

The emulator and the schemas accept things a real cluster would not; each test here encodes one
documented behaviour of the component that acts on the object (KubeRay 1.7's RayJob validation
and deletion, the API server's storage of empty fields, the kubelet's fsGroup handling) and
checks every object the operator renders against it.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

import pytest
import tomllib

from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from retool_operator import builders
from retool_operator.builders.stages import merge_memory_gib
from retool_operator.profiles import RAY_VERSION, TRAINER_UID
from retool_operator.render import desired_objects
from tests.conftest import REPO
from tests.operator.helpers import CONFIG, config_for, document, run_of
from tests.render.cases import VARIANTS

Obj = dict[str, Any]
RAY_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


def kuberay_problems(rayjob: Obj) -> list[str]:
    """What KubeRay 1.7's controller refuses (``ValidateRayJobSpec``; the RayJob ends in
    ValidationFailed) or never cleans up, for the fields the operator renders."""
    spec = rayjob["spec"]
    problems: list[str] = []
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    deletion = spec.get("deletionStrategy") or {}
    if spec.get("suspend") and not shutdown:
        problems.append("a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended")
    if not shutdown and spec.get("ttlSecondsAfterFinished", 0) > 0:
        problems.append("shutdownAfterJobFinishes false cannot have TTLSecondsAfterFinished")
    if deletion.get("deletionRules") and shutdown:
        problems.append("spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually exclusive")
    if spec.get("submissionMode") == "SidecarMode" and "submitterPodTemplate" in spec:
        problems.append("SidecarMode doesn't support SubmitterPodTemplate")
    cluster = spec["rayClusterSpec"]
    for name, group in [("Head", cluster["headGroupSpec"]), *[(g["groupName"], g) for g in cluster.get("workerGroupSpecs") or []]]:
        if group.get("resources") and any(group.get("rayStartParams", {}).get(p) for p in RAY_RESOURCE_PARAMS):
            problems.append(f"resource fields should not be set in both rayStartParams and Resources for {name} group")
    if "entrypointResources" in spec:
        resources = json.loads(spec["entrypointResources"])  # KubeRay's HTTP mode unmarshals it; the CLI passes it on
        if not isinstance(resources, dict) or not all(isinstance(v, int | float) for v in resources.values()):
            problems.append("entrypointResources must be a JSON object of numbers")
        if {"CPU", "GPU", "memory"} & set(resources):
            problems.append("Ray refuses CPU/GPU/memory in entrypoint_resources")
    # Release of the accelerators: KubeRay deletes the cluster on Complete and Failed only with
    # shutdownAfterJobFinishes (legacy onSuccess/onFailure act only on a terminal jobStatus).
    if not shutdown and not deletion.get("deletionRules"):
        problems.append("the Ray cluster is never deleted when the job ends")
    if shutdown and spec.get("ttlSecondsAfterFinished", 0) > 600:
        problems.append(f"the Ray cluster holds its accelerators {spec['ttlSecondsAfterFinished']}s after the job ends")
    return problems


def rayjobs_of(doc: Obj) -> list[Obj]:
    return [o for o in desired_objects(doc, config=config_for(doc)) if o["kind"] == "RayJob"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rayjob_is_one_kuberay_accepts_suspended_or_not_and_releases_its_cluster(variant: str) -> None:
    for rayjob in rayjobs_of(VARIANTS[variant]()):
        assert kuberay_problems(rayjob) == [], rayjob["metadata"]["name"]
        suspended = {**rayjob, "spec": {**rayjob["spec"], "suspend": True}}  # what spec.suspend and Kueue do to it
        assert kuberay_problems(suspended) == [], rayjob["metadata"]["name"]


def test_the_kuberay_check_can_fail() -> None:
    """The previous rendering (NPUs in rayStartParams plus a resources field, a one-hour TTL) and a
    deletionRules variant that would break suspension are all caught."""
    rayjob = rayjobs_of(document(hardware={"accelerator": "ascend"}))[0]
    old = json.loads(json.dumps(rayjob))
    old["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["resources"] = '"{\\"NPU\\": 8}"'
    old["spec"]["ttlSecondsAfterFinished"] = 3600
    assert len(kuberay_problems(old)) == 2
    rules = json.loads(json.dumps(rayjob))
    rules["spec"]["deletionStrategy"] = {"deletionRules": [{"condition": {"jobStatus": "SUCCEEDED"}, "policy": "DeleteCluster"}]}
    assert "mutually exclusive" in " ".join(kuberay_problems(rules))
    rules["spec"]["shutdownAfterJobFinishes"] = False
    rules["spec"]["ttlSecondsAfterFinished"] = 0
    rules["spec"]["suspend"] = True
    assert "not allowed to be suspended" in " ".join(kuberay_problems(rules))


TTL_CASES = {
    # The operator deletes an unkept cluster itself at once; KubeRay's TTL is the window to keep it for a
    # retry, and frees the devices when the operator is down (cluster_reuse.KEEP_WINDOW_SECONDS).
    "default: the reuse window, the operator releases at once": ({}, {}, 30),
    "a grace above the window": ({"clusterGraceSeconds": 120}, {}, 120),
    "no retry on the same cluster: released at once by KubeRay": ({"retryOnSameCluster": False}, {}, 0),
    "queued by Kueue: never reused, released at once by KubeRay": ({}, {"queueName": "team"}, 0),
}


@pytest.mark.parametrize(("policy", "scheduling", "expected"), TTL_CASES.values(), ids=TTL_CASES.keys())
def test_the_cluster_is_deleted_when_the_job_ends(policy: dict, scheduling: dict, expected: int) -> None:
    for rayjob in rayjobs_of(document(failurePolicy=policy, scheduling=scheduling)):
        assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
        assert rayjob["spec"]["ttlSecondsAfterFinished"] == expected
        # K8sJobMode: the submitter Job follows the driver's log and outlives the cluster.
        assert rayjob["spec"]["submissionMode"] == "K8sJobMode" and "submitterPodTemplate" in rayjob["spec"]


def test_the_grace_period_is_bounded() -> None:
    from retool.spec.validate import validate_document

    problems = validate_document(document(failurePolicy={"clusterGraceSeconds": 3600}))
    assert [p.path for p in problems] == ["spec.failurePolicy.clusterGraceSeconds"]


def test_finished_batch_jobs_keep_their_logs_until_the_run_goes() -> None:
    for obj in desired_objects(document(), config=CONFIG):
        if obj["kind"] == "Job":
            assert "ttlSecondsAfterFinished" not in obj["spec"]


def test_ray_version_is_the_pinned_ray_of_the_images() -> None:
    train = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    pins = [re.fullmatch(r"ray(\[[a-z,]+\])?==(.+)", dep) for dep in train]
    (pin,) = [m.group(2) for m in pins if m]
    assert pin == RAY_VERSION
    for rayjob in rayjobs_of(document()) + rayjobs_of(document(hardware={"accelerator": "ascend"})):
        assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == RAY_VERSION


@pytest.mark.parametrize(
    ("hardware", "group_resources"),
    [({}, {"GPU": "8"}), ({"accelerator": "ascend", "nodes": 2}, {"NPU": "8"}), ({"accelerator": "ascend", "devicesPerNode": 16}, {"NPU": "16"})],
    ids=["nvidia-gpus", "ascend-npus-on-head-and-workers", "ascend-sixteen-npus"],
)
def test_devices_reach_ray_through_the_groups_resources_field(hardware: dict, group_resources: dict) -> None:
    for rayjob in rayjobs_of(document(hardware=hardware)):
        cluster = rayjob["spec"]["rayClusterSpec"]
        for group in [cluster["headGroupSpec"], *(cluster.get("workerGroupSpecs") or [])]:
            assert group["resources"] == group_resources
            assert not set(group["rayStartParams"]) & set(RAY_RESOURCE_PARAMS)


@pytest.mark.parametrize(
    ("hardware", "stage", "expected"),
    [
        ({"accelerator": "ascend"}, "sft", {"entrypointResources": '{"NPU": 8}'}),
        ({}, "sft", {"entrypointNumGpus": 8}),
        ({"accelerator": "ascend"}, "rl", {}),
        ({"accelerator": "ascend"}, "eval", {}),
        ({"accelerator": "ascend", "nodes": 2}, "sft", {}),
        ({"nodes": 2}, "sft", {}),
    ],
    ids=[
        "one-node-sft-on-ascend-requests-its-npus-so-ray-keeps-ASCEND_RT_VISIBLE_DEVICES",
        "one-node-sft-on-gpus-requests-its-gpus",
        "rl-drivers-leave-the-devices-to-verls-workers",
        "eval-drivers-leave-the-devices-to-verls-workers",
        "multi-node-sft-leaves-the-devices-to-its-torchrun-actors",
        "multi-node-sft-on-gpus-too",
    ],
)
def test_entrypoint_devices(hardware: dict, stage: str, expected: dict) -> None:
    rayjob = builders.build_stage_rayjob(run_of(hardware=hardware), stage, 1, config=CONFIG, tracking=builders.Tracking())
    assert {k: v for k, v in rayjob["spec"].items() if k in ("entrypointResources", "entrypointNumGpus", "entrypointNumCpus")} == expected


@pytest.mark.parametrize("accelerator", ["nvidia", "ascend"])
def test_torch_backend_autoload_is_off_only_in_ascend_pods_without_npus(accelerator: str) -> None:
    for obj in desired_objects(document(hardware={"accelerator": accelerator}), config=CONFIG):
        if obj["kind"] == "Job":
            env = {e["name"]: e.get("value") for e in obj["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == ("0" if accelerator == "ascend" else None), obj["metadata"]["name"]
        elif obj["kind"] == "RayJob":  # Ray pods have NPUs: torch_npu must load there
            head = obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in {e["name"] for e in head["env"]}


@pytest.mark.parametrize(
    ("model", "size", "memory"),
    [
        ("Qwen/Qwen2.5-32B-Instruct", None, "223Gi"),
        ("Qwen/Qwen2.5-7B-Instruct", None, "55Gi"),
        ("Qwen/Qwen2.5-0.5B-Instruct", None, "16Gi"),
        ("org/custom-model", 72.0, "491Gi"),
        ("org/custom-model", None, "192Gi"),
    ],
    ids=["32b-holds-its-fp32-shards-and-bf16-copy", "7b", "tiny-models-get-the-floor", "size-from-the-spec", "unknown-size-keeps-the-default"],
)
def test_merge_memory_follows_the_model(model: str, size: float | None, memory: str) -> None:
    spec: dict[str, Any] = {"base": model} if size is None else {"base": model, "sizeBillions": size}
    job = builders.build_stage_job(run_of(model=spec), "merge", 1, config=CONFIG, tracking=builders.Tracking())
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory


def test_merge_memory_covers_the_estimated_peak() -> None:
    """32B: fp32 shards (128 GB) + bf16 copy (64 GB) = 179 GiB peak, above the old 192Gi limit once Python is counted."""
    peak = 32e9 * 6 / 2**30
    assert merge_memory_gib(32) >= peak * 1.2


def _dockerfile_user(image: str) -> str:
    users = re.findall(r"^USER\s+(\S+)", (REPO / "images" / image / "Dockerfile").read_text(), flags=re.M)
    return users[-1]


@pytest.mark.parametrize(("accelerator", "image"), [("nvidia", "trainer-cuda"), ("ascend", "trainer-ascend")])
def test_stage_pods_run_as_the_images_user_and_can_write_a_fresh_claim(accelerator: str, image: str) -> None:
    """fsGroup (with OnRootMismatch) on every stage pod; runAsNonRoot with the image's own uid where it has one."""
    user = _dockerfile_user(image)
    for obj in desired_objects(document(hardware={"accelerator": accelerator, "nodes": 2}), config=CONFIG):
        for where, tpl in _stage_templates(obj):
            context = tpl["spec"]["securityContext"]
            assert context["fsGroup"] == TRAINER_UID and context["fsGroupChangePolicy"] == "OnRootMismatch", (obj["metadata"]["name"], where)
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            if user == "root":
                assert "runAsNonRoot" not in context and "runAsUser" not in context
            else:
                assert f"{context['runAsUser']}:{context['runAsGroup']}" == user and context["runAsNonRoot"] is True


def _stage_templates(obj: Obj) -> list[tuple[str, Obj]]:
    if obj["kind"] == "Job":
        return [("pod", obj["spec"]["template"])]
    if obj["kind"] == "RayJob":
        cluster = obj["spec"]["rayClusterSpec"]
        return [("head", cluster["headGroupSpec"]["template"]), ("submitter", obj["spec"]["submitterPodTemplate"])] + [
            (g["groupName"], g["template"]) for g in cluster.get("workerGroupSpecs") or []
        ]
    return []


@pytest.mark.parametrize(
    "hardware", [{"accelerator": "ascend"}, {"product": "NVIDIA-H200"}, {"nodeSelector": {"kubernetes.io/arch": "amd64"}}], ids=["ascend", "nvidia-product", "nvidia-arch"]
)
def test_the_submitter_runs_where_the_trainer_image_runs(hardware: dict) -> None:
    """Same image, nodes, tolerations and user as the Ray head: an arm64 Ascend cluster or a
    mixed-arch one never schedules it on a node that cannot run the ~20 GB trainer image."""
    rayjob = rayjobs_of(document(hardware=hardware))[0]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]
    for key in ("nodeSelector", "tolerations", "securityContext", "imagePullSecrets", "serviceAccountName"):
        assert submitter.get(key) == head.get(key), key
    assert submitter["containers"][0]["image"] == head["containers"][0]["image"]
    assert submitter["nodeSelector"]  # never "any node"


def _drops_empty(value: Any, path: str = "") -> list[str]:
    """Paths of empty lists/maps: a Go client object with omitempty fields stores none of them."""
    found: list[str] = []
    if isinstance(value, dict):
        if not value and path:
            found.append(path)
        for key, item in value.items():
            found += _drops_empty(item, f"{path}.{key}")
    elif isinstance(value, list):
        if not value:
            found.append(path)
        for i, item in enumerate(value):
            found += _drops_empty(item, f"{path}[{i}]")
    return found


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_core_children_carry_no_empty_lists_or_maps(variant: str) -> None:
    """The API server drops empty lists and maps of core kinds when it stores them, so a desired
    object with one never matches the stored object and the operator would patch it on every
    resync (``egress: []`` in the sandbox NetworkPolicy did). RayJobs (unstructured) keep theirs."""
    doc = VARIANTS[variant]()
    for obj in desired_objects(doc, config=config_for(doc)) + builders.build_mlflow("ml", config=CONFIG):
        if obj["kind"] != "RayJob":
            assert _drops_empty(obj) == [], (obj["kind"], obj["metadata"]["name"])


def test_files_land_under_the_claims_subpath_once() -> None:
    """A stage writes run_paths(run); through the pod's mount that is <subPath>/<namespace>/<name> on the claim."""
    run = run_of(storage={"pvc": {"claimName": "shared", "mountPath": "/mnt", "subPath": "team-a"}})
    job = builders.build_stage_job(run, "prepare", 1, config=CONFIG, tracking=builders.Tracking())
    (mount,) = [m for m in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "data"]
    relative = posixpath.relpath(run_paths(run).root, mount["mountPath"])
    on_claim = posixpath.join(mount.get("subPath", ""), relative)
    assert on_claim == "team-a/ml/demo"


def test_the_operators_scraper_may_reach_the_sandbox_metrics() -> None:
    config = CONFIG.model_copy(update={"metrics_scraper_namespaces": "kubernetes.io/metadata.name=monitoring"})
    (policy,) = [o for o in builders.build_sandbox(run_of(), config=config, replicas=1) if o["kind"] == "NetworkPolicy"]
    rules = policy["spec"]["ingress"]
    assert {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}], "ports": [{"protocol": "TCP", "port": 8080}]} in rules
    (policy,) = [o for o in builders.build_sandbox(run_of(), config=CONFIG, replicas=1) if o["kind"] == "NetworkPolicy"]
    assert len(policy["spec"]["ingress"]) == 1  # no scraper configured: stage pods only


def test_examples_name_gpu_products_nodes_carry() -> None:
    """GPU feature discovery labels an H200 node nvidia.com/gpu.product=NVIDIA-H200; 'H200' matches none."""
    import yaml

    from retool.spec.validate import document_warnings

    paths = sorted((REPO / "examples").rglob("*.yaml"))
    runs = [d for p in paths for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict) and d.get("kind") == "RetoolRun"]
    assert len(runs) >= 4
    for doc in runs:
        assert document_warnings(doc) == [], doc["metadata"]["name"]
    parse_run(runs[0])


@pytest.mark.parametrize(
    ("deadline", "pod_deadline"), [(None, None), (7200, 7500)], ids=["no-stage-deadline-no-pod-deadline", "stage-deadline-bounds-the-submitter-pod"]
)
def test_the_submitter_job_never_replaces_its_pod_and_ends_with_the_stage(deadline: int | None, pod_deadline: int | None) -> None:
    """KubeRay's submitter Job defaults to backoffLimit 2 (createNewK8sJob, rayjob_controller.go
    v1.6.1/v1.7.0); a replacement pod after the cluster is gone waits for its GCS forever (common/job.go
    v1.7.0). The operator retries with attempts of its own, so the submitter gets none."""
    policy = {} if deadline is None else {"stageDeadlineSeconds": deadline}
    for rayjob in rayjobs_of(document(failurePolicy=policy)):
        assert rayjob["spec"]["submitterConfig"] == {"backoffLimit": 0}
        template = rayjob["spec"]["submitterPodTemplate"]
        assert template["spec"].get("activeDeadlineSeconds") == pod_deadline
        assert template["metadata"]["labels"]["retool.dev/pod-role"] == "submitter"
