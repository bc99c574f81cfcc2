"""Table tests of the pure builders and hardware profiles (whole objects or the fields that matter)."""

from __future__ import annotations

import pytest

from retool.spec.names import SANDBOX_PORT
from retool_operator import builders
from retool_operator.config import OperatorConfig, parse_selector
from retool_operator.profiles import hardware_profile
from tests.operator.helpers import CONFIG, run_of


@pytest.mark.parametrize(
    ("max_concurrent", "per_replica", "suspend", "stage", "finished", "expected"),
    [
        (256, 16, False, "rl", False, 16),
        (250, 16, False, "rl", False, 16),
        (17, 16, False, "eval", False, 2),
        (16, 16, False, "rl", False, 1),
        (256, 16, True, "rl", False, 0),
        (256, 16, False, None, True, 0),
        (256, 16, False, "prepare", False, 0),
        (256, 16, False, "sft", False, 0),
        (256, 16, False, "merge", False, 0),
    ],
    ids=[
        "256-over-16-is-16",
        "rounds-up",
        "one-over-needs-a-second-replica-during-eval",
        "exactly-one",
        "suspended-scales-to-zero",
        "finished-scales-to-zero",
        "none-while-preparing",
        "none-during-sft",
        "none-during-merge",
    ],
)
def test_sandbox_replicas(max_concurrent: int, per_replica: int, suspend: bool, stage: str | None, finished: bool, expected: int) -> None:
    """The sandbox is sized for maxConcurrent only while a stage that calls it (rl, eval) is current."""
    memory = f"{per_replica}Gi"
    run = run_of(
        sandbox={"maxConcurrent": max_concurrent, "perReplicaConcurrency": per_replica, "resources": {"limits": {"memory": memory}}}, suspend=suspend
    )
    assert builders.desired_sandbox_replicas(run, stage=stage, finished=finished) == expected


def test_sandbox_replicas_left_to_an_hpa() -> None:
    """replicas=None (an HPA owns the field): absent from the Deployment, so create and patch never touch it."""
    dep = builders.build_sandbox_deployment(run_of(), config=CONFIG, replicas=None)
    assert "replicas" not in dep["spec"]


def test_sandbox_deployment_is_locked_down() -> None:
    run = run_of()
    dep = builders.build_sandbox_deployment(run, config=CONFIG, replicas=2)
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": builders.SANDBOX_RUN_AS_USER,
        "runAsGroup": builders.SANDBOX_RUN_AS_USER,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["command"] == ["retool", "sandbox", "serve", "--host", "0.0.0.0", "--port", "8080", "--workers", "16"]
    assert container["image"] == "retool/sandbox:test"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RETOOL_SANDBOX_MAX_MEMORY_LIMIT_MB"] == "1024" and env["RETOOL_SANDBOX_MAX_RUN_TIMEOUT_S"] == "30.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": SANDBOX_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": SANDBOX_PORT}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_sandbox_image_override_wins() -> None:
    run = run_of(sandbox={"image": "example/sandbox:dev"})
    assert builders.build_sandbox_deployment(run, config=CONFIG, replicas=1)["spec"]["template"]["spec"]["containers"][0]["image"] == "example/sandbox:dev"


def test_network_policy_denies_egress_and_admits_only_this_runs_stage_pods() -> None:
    run = run_of(name="alpha")
    policy = builders.build_sandbox_network_policy(run)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "egress" not in policy["spec"]  # Egress in policyTypes with no rule denies all (and [] would be dropped by the API server)
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"retool.dev/run": "alpha", "retool.dev/component": "stage"}}}], "ports": [{"protocol": "TCP", "port": 8080}]}
    ]
    # The stage pods do carry those labels.
    rayjob = builders.build_stage_rayjob(run, "rl", 1, config=CONFIG, tracking=builders.Tracking())
    pod_labels = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert {"retool.dev/run": "alpha", "retool.dev/component": "stage"}.items() <= pod_labels.items()


@pytest.mark.parametrize(
    ("hardware", "device", "selector", "ray_resources", "image"),
    [
        ({}, "nvidia.com/gpu", {}, {"GPU": "8"}, CONFIG.trainer_image_nvidia),
        ({"product": "NVIDIA-H200"}, "nvidia.com/gpu", {"nvidia.com/gpu.product": "NVIDIA-H200"}, {"GPU": "8"}, CONFIG.trainer_image_nvidia),
        ({"accelerator": "ascend", "devicesPerNode": 8}, "huawei.com/Ascend910", {"accelerator": "huawei-Ascend910"}, {"NPU": "8"}, CONFIG.trainer_image_ascend),
        (
            {"accelerator": "ascend", "devicesPerNode": 16, "deviceResourceName": "huawei.com/Ascend910B", "nodeSelector": {"pool": "npu"}},
            "huawei.com/Ascend910B",
            {"accelerator": "huawei-Ascend910", "pool": "npu"},
            {"NPU": "16"},
            CONFIG.trainer_image_ascend,
        ),
        ({"image": "example/trainer:dev", "nodeSelector": {"zone": "a"}}, "nvidia.com/gpu", {"zone": "a"}, {"GPU": "8"}, "example/trainer:dev"),
    ],
    ids=["nvidia-default", "nvidia-product-selects-gpu-product", "ascend-declares-npu-ray-resource", "ascend-custom-resource-and-selector", "image-override"],
)
def test_hardware_profiles(hardware: dict, device: str, selector: dict, ray_resources: dict, image: str) -> None:
    run = run_of(hardware=hardware)
    profile = hardware_profile(run.spec.hardware, CONFIG)
    assert profile.device_resource == device
    assert profile.node_selector == selector
    assert profile.ray_resources == ray_resources
    assert profile.image == image
    resources = profile.device_resources()
    assert resources["limits"][device] == resources["requests"][device] == str(run.spec.hardware.devices_per_node)
    assert {"key": "nvidia.com/gpu" if device.startswith("nvidia") else device, "operator": "Exists", "effect": "NoSchedule"} in profile.tolerations


def test_a_cpu_rehearsal_asks_for_no_device_and_declares_its_training_slots_to_ray() -> None:
    """hardware.accelerator cpu (docs/rehearsal.md): no device resource, selector or toleration; the 0.9 line's CUDA image; slots as Ray GPUs."""
    run = run_of(
        hardware={"accelerator": "cpu", "devicesPerNode": 2, "nodeSelector": {"pool": "cpu"}},
        rl={"rolloutEngine": "hf", "tensorParallel": 1, "sequenceParallel": 1},
        sft={"sequenceParallel": 1},
        trainer={"verl": "0.9.1"},
    )
    profile = hardware_profile(run.spec.hardware, CONFIG, run.spec.trainer.verl)
    assert profile.device_resource == ""
    assert (profile.node_selector, profile.tolerations) == ({"pool": "cpu"}, [])
    assert profile.image == CONFIG.trainer_image_nvidia_verl09
    assert profile.ray_resources == {"GPU": "2"}, "verl 0.9.1 sizes the cluster by its GPUs or NPUs"
    resources = profile.device_resources()
    assert not any(name.endswith(("/gpu", "Ascend910")) for part in resources.values() for name in part)
    rayjob = builders.build_stage_rayjob(run, "rl", 1, config=CONFIG, tracking=builders.Tracking())
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["resources"] == {"GPU": "2"}
    assert "nvidia.com/gpu" not in str(head["template"]["spec"]["containers"])


def test_config_reads_environment_and_parses_selectors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETOOL_OPERATOR_ASCEND_NODE_SELECTOR", "accelerator=ascend,pool=a")
    monkeypatch.setenv("RETOOL_OPERATOR_NAMESPACES", "ml, research")
    monkeypatch.setenv("RETOOL_OPERATOR_WEBHOOK_ENABLED", "true")
    config = OperatorConfig()
    assert config.ascend_selector == {"accelerator": "ascend", "pool": "a"}
    assert config.namespace_list == ["ml", "research"]
    assert config.webhook_enabled is True
    with pytest.raises(ValueError, match="not key=value"):
        parse_selector("accelerator")


@pytest.mark.parametrize(
    ("nodes", "worker_replicas"), [(1, None), (2, 1), (4, 3)], ids=["one-node-is-head-only", "two-nodes-one-worker", "four-nodes-three-workers"]
)
def test_rayjob_cluster_shape(nodes: int, worker_replicas: int | None) -> None:
    run = run_of(hardware={"nodes": nodes}, failurePolicy={"stageDeadlineSeconds": 7200, "clusterGraceSeconds": 600})
    job = builders.build_stage_rayjob(run, "sft", 2, config=CONFIG, tracking=builders.Tracking(uri="http://mlflow:5000", parent_run_id="p1"))
    spec = job["spec"]
    assert job["metadata"]["name"] == "demo-sft-2"
    assert spec["entrypoint"] == "python3 -m retool.stage sft --spec /etc/retool/run.yaml"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 600
    assert spec["activeDeadlineSeconds"] == 7200
    workers = spec["rayClusterSpec"].get("workerGroupSpecs")
    if worker_replicas is None:
        assert workers is None
    else:
        assert [w["replicas"] for w in workers] == [worker_replicas]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in head["env"]}
    assert env["RETOOL_ATTEMPT"] == "2"
    assert env["RETOOL_SANDBOX_URL"] == "http://demo-sandbox.ml.svc:8080"
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert env["RETOOL_MLFLOW_PARENT_RUN_ID"] == "p1"
    assert env["MLFLOW_EXPERIMENT_NAME"] == "ml/demo"
    assert env["RETOOL_RUN_UID"] == "uid-1"
    assert head["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_stage_job_mounts_spec_pvc_and_shm_and_reads_s3_secret() -> None:
    run = run_of(
        storage={"pvc": {"claimName": "shared", "mountPath": "/mnt/data", "subPath": "team-a"}, "s3": {"uri": "s3://bucket/p", "secretRef": {"name": "s3-creds"}}},
        hardware={"sharedMemory": "32Gi"},
    )
    job = builders.build_stage_job(run, "prepare", 1, config=CONFIG, tracking=builders.Tracking())
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python3", "-m", "retool.runtime.cpu_only", "-m", "retool.stage", "prepare", "--spec", "/etc/retool/run.yaml"]
    assert container["volumeMounts"] == [
        {"name": "run-spec", "mountPath": "/etc/retool", "readOnly": True},
        {"name": "data", "mountPath": "/mnt/data"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in pod["volumes"]
    assert {"name": "run-spec", "configMap": {"name": "demo-prepare-1-spec"}} in pod["volumes"]  # the attempt's own snapshot
    assert {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}}} in container["env"]
    assert job["spec"]["backoffLimit"] == 0
    assert pod["restartPolicy"] == "Never"
    assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_spec_configmap_round_trips_through_the_model() -> None:
    import yaml

    from retool.spec.validate import parse_run

    run = run_of()
    cm = builders.build_spec_configmap(run, "demo-rl-2")
    assert cm["metadata"]["name"] == "demo-rl-2-spec"
    reparsed = parse_run(yaml.safe_load(cm["data"]["run.yaml"]))
    assert reparsed.spec == run.spec


def test_owned_by_sets_a_controller_reference() -> None:
    obj = builders.build_sandbox_service(run_of())
    owned = builders.owned_by(obj, run_name="demo", run_uid="u-9")
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "name": "demo", "uid": "u-9", "controller": True, "blockOwnerDeletion": True}
    ]
    assert "ownerReferences" not in obj["metadata"]


def test_managed_mlflow_is_not_owned_by_any_run() -> None:
    objs = builders.build_mlflow("ml", config=CONFIG)
    assert [o["kind"] for o in objs] == ["PersistentVolumeClaim", "Deployment", "Service"]
    assert all("ownerReferences" not in o["metadata"] for o in objs)
    assert builders.managed_mlflow_uri("ml") == "http://retool-mlflow.ml.svc:5000"


@pytest.mark.parametrize(
    ("accelerator", "line", "image"),
    [
        ("nvidia", "0.6.1", CONFIG.trainer_image_nvidia),
        ("nvidia", "0.9.1", CONFIG.trainer_image_nvidia_verl09),
        ("ascend", "0.6.1", CONFIG.trainer_image_ascend),
        ("ascend", "0.9.1", CONFIG.trainer_image_ascend_verl09),
    ],
    ids=["nvidia-0.6", "nvidia-0.9", "ascend-0.6", "ascend-0.9"],
)
def test_every_stage_of_a_run_uses_its_verl_lines_trainer_image(accelerator: str, line: str, image: str) -> None:
    run = run_of(hardware={"accelerator": accelerator}, trainer={"verl": line})
    assert len({CONFIG.trainer_image_nvidia, CONFIG.trainer_image_nvidia_verl09, CONFIG.trainer_image_ascend, CONFIG.trainer_image_ascend_verl09}) == 4
    job = builders.build_stage_job(run, "prepare", 1, config=CONFIG, tracking=builders.Tracking())
    assert {c["image"] for c in job["spec"]["template"]["spec"]["containers"]} == {image}
    rayjob = builders.build_stage_rayjob(run, "rl", 1, config=CONFIG, tracking=builders.Tracking())
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == image
