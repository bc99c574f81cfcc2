"""Every manifest the builders produce is valid: core kinds against the Kubernetes OpenAPI schema
(kubernetes-validate --strict, in-process), Ray kinds against the CRD schemas of the pinned KubeRay
(tests/manifest_check.py: defaults, types, enums, and fields the API server would prune).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from retool_operator.builders import build_mlflow
from retool_operator.render import desired_objects
from tests.conftest import EXAMPLES, REPO
from tests.manifest_check import crd_schemas, problems, pruned_fields
from tests.operator.helpers import CONFIG, config_for, document


def kuberay_schemas() -> dict[tuple[str, str], dict]:
    """The KubeRay CRD schemas (read once per test process)."""
    return crd_schemas()


@pytest.fixture(scope="module")
def ray_schemas() -> dict[tuple[str, str], dict]:
    return kuberay_schemas()


def problems_of(objects: list[dict[str, Any]], ray_schemas: dict, tmp_path: Path) -> list[str]:
    """The checker's problems, after a YAML round trip (what `kubectl apply -f` of a file would send)."""
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return problems(yaml.safe_load_all(path.read_text()))


VARIANTS = {
    "nvidia-one-node": {},
    "nvidia-two-nodes-product-deadline": {"hardware": {"nodes": 2, "product": "NVIDIA-H200"}, "failurePolicy": {"stageDeadlineSeconds": 3600}},
    "ascend-one-node": {"hardware": {"accelerator": "ascend"}},
    "cpu-rehearsal-two-nodes": {
        "hardware": {"accelerator": "cpu", "nodes": 2, "devicesPerNode": 1},
        "rl": {"rolloutEngine": "hf", "tensorParallel": 1, "sequenceParallel": 1, "batchSize": 2, "miniBatchSize": 2},
        "sft": {"sequenceParallel": 1, "batchSize": 2, "microBatchSizePerDevice": 1},
        "trainer": {"verl": "0.9.1"},
    },
    "ascend-four-nodes-s3": {
        "hardware": {"accelerator": "ascend", "nodes": 4, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]},
        "storage": {"pvc": {"claimName": "data", "subPath": "runs"}, "s3": {"uri": "s3://bucket/prefix", "endpoint": "http://minio:9000", "secretRef": {"name": "s3"}}},
    },
}


@pytest.mark.parametrize("spec", list(VARIANTS.values()), ids=list(VARIANTS))
def test_variants_are_valid(spec: dict, ray_schemas: dict, tmp_path: Path) -> None:
    objects = desired_objects(document(**spec), config=CONFIG)
    assert {o["kind"] for o in objects} == {"ConfigMap", "Service", "NetworkPolicy", "PodDisruptionBudget", "Deployment", "Job", "RayJob"}
    assert problems_of(objects, ray_schemas, tmp_path) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid(example: Path, ray_schemas: dict, tmp_path: Path) -> None:
    doc = yaml.safe_load(example.read_text())
    doc["metadata"]["uid"] = "0b6f8d5e-1111-2222-3333-444455556666"
    assert problems_of(desired_objects(doc, config=config_for(doc)), ray_schemas, tmp_path) == []


def test_managed_mlflow_is_valid(ray_schemas: dict, tmp_path: Path) -> None:
    assert problems_of(build_mlflow("ml", config=CONFIG), ray_schemas, tmp_path) == []


def test_checker_catches_a_broken_manifest(ray_schemas: dict, tmp_path: Path) -> None:
    """The checks can fail: a typo in a core object and an unknown RayJob field are both reported."""
    objects = desired_objects(document(), config=CONFIG, stage="rl")
    objects[1]["spec"]["portz"] = []
    objects[-1]["spec"]["shutdownAfterJobFinish"] = True
    found = problems_of(objects, ray_schemas, tmp_path)
    assert any("portz" in p for p in found)
    assert any("shutdownAfterJobFinish" in p for p in found)


def test_status_the_operator_writes_fits_the_crd(tmp_path: Path) -> None:
    """Every status field the operator writes exists in the generated CRD (nothing would be pruned)."""
    import datetime as dt

    from retool.spec.status import RetoolRunStatus, StageStatus
    from retool_operator.reconcile import Observed, decide
    from retool_operator.status import dump, invalid_spec_status
    from tests.operator.helpers import T0, rayjob_status, run_of

    crd = yaml.safe_load((REPO / "charts" / "retool" / "crds" / "retoolruns.retool.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    run = run_of()
    retrying = decide(
        run,
        RetoolRunStatus(stages=[StageStatus(name="prepare", state="Succeeded", attempt=1), StageStatus(name="sft", state="Running", attempt=1, job="demo-sft-1")]),
        Observed(children={"demo-sft-1": rayjob_status("Complete", "FAILED")}, results={"aime_2024": {"mean@30": 0.5}}),
        T0,
    ).status
    statuses = [
        dump(retrying),
        dump(invalid_spec_status(retrying, ["spec.rl.steps: bad"], now=T0 + dt.timedelta(seconds=1), generation=2)),
    ]
    for status in statuses:
        assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(status)] == []
        assert pruned_fields(status, schema) == []
    assert next(s for s in statuses[0]["stages"] if s["name"] == "sft")["nextAttemptTime"]


def _example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / f"retoolrun-{name}.yaml").read_text())
    doc["metadata"]["uid"] = "0b6f8d5e-1111-2222-3333-444455556666"
    return doc


def test_kueue_example_hands_every_stage_to_its_queue_suspended(ray_schemas: dict, tmp_path: Path) -> None:
    objects = desired_objects(_example("qwen32b-kueue"), config=CONFIG)
    children = [o for o in objects if o["kind"] in ("Job", "RayJob")]
    assert {o["metadata"]["name"].rsplit("-", 2)[-2] for o in children} == {"prepare", "preflight", "sft", "merge", "rl", "eval"}
    for child in children:
        assert child["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "ml-team-gpus"
        assert child["spec"]["suspend"] is True  # Kueue unsuspends on admission
    for rayjob in (o for o in children if o["kind"] == "RayJob"):
        assert rayjob["spec"]["shutdownAfterJobFinishes"] is True  # Kueue and KubeRay require it for suspension
    claim = next(o for o in objects if o["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "cephfs"
    assert "ownerReferences" not in claim["metadata"]  # retain: keep (the default)
    assert problems_of(objects, ray_schemas, tmp_path) == []


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ("volcano", {"volcano.sh/queue-name": "research", "ray.io/priority-class-name": "ml-research"}),
        ("yunikorn", {"ray.io/gang-scheduling-enabled": "true", "yunikorn.apache.org/queue": "research"}),
    ],
)
def test_gang_example_labels_every_rayjob_for_the_configured_batch_scheduler(scheduler: str, expected: dict[str, str], ray_schemas: dict, tmp_path: Path) -> None:
    config = CONFIG.model_copy(update={"batch_scheduler": scheduler})
    objects = desired_objects(_example("qwen32b-volcano"), config=config)
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        if obj["kind"] == "RayJob":
            assert expected.items() <= labels.items(), obj["metadata"]["name"]
            if scheduler == "yunikorn":
                assert labels["yunikorn.apache.org/app-id"] == obj["metadata"]["name"]  # unique per attempt
            assert "suspend" not in obj["spec"]
        else:
            assert not set(expected) & set(labels), obj["metadata"]["name"]  # single-pod Jobs: nothing to gang
    assert problems_of(objects, ray_schemas, tmp_path) == []


def test_gang_scheduling_without_a_batch_scheduler_is_refused_not_ignored() -> None:
    from retool.spec.validate import SpecError

    with pytest.raises(SpecError, match="knows no batch scheduler"):
        desired_objects(_example("qwen32b-volcano"), config=CONFIG)
    with pytest.raises(SpecError, match="queue every stage twice"):
        desired_objects(_example("qwen32b-kueue"), config=CONFIG.model_copy(update={"batch_scheduler": "volcano"}))


def test_example_that_names_only_a_model_renders_its_claim(ray_schemas: dict, tmp_path: Path) -> None:
    objects = desired_objects(_example("minimal"), config=CONFIG)
    claim = next(o for o in objects if o["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "minimal-data"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2000Gi"}}}
    assert "ownerReferences" not in claim["metadata"]
    mounts = {v["persistentVolumeClaim"]["claimName"] for o in objects for v in _volumes(o) if "persistentVolumeClaim" in v}
    assert mounts == {"minimal-data"}
    assert problems_of(objects, ray_schemas, tmp_path) == []


def _volumes(obj: dict[str, Any]) -> list[dict[str, Any]]:
    from tests.operator.test_pods import pod_templates

    return [v for _, tpl in pod_templates(obj) for v in tpl["spec"].get("volumes", [])]


def test_text_only_example_renders_no_sandbox_and_no_tool(ray_schemas: dict, tmp_path: Path) -> None:
    objects = desired_objects(_example("qwen32b-h200-text-only"), config=CONFIG)
    assert {o["kind"] for o in objects} == {"ConfigMap", "Job", "RayJob"}  # no Deployment, Service, NetworkPolicy, PDB
    assert not any("sandbox" in o["metadata"]["name"] for o in objects)
    for obj in objects:
        text = yaml.safe_dump(obj)
        assert "RETOOL_SANDBOX_URL" not in text and "code_interpreter" not in text, obj["metadata"]["name"]
    assert problems_of(objects, ray_schemas, tmp_path) == []


def test_a_deleted_claim_goes_with_the_run_only_with_retain_delete() -> None:
    objects = desired_objects(_example("smoke-qwen0.5b"), config=CONFIG)
    claim = next(o for o in objects if o["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "RetoolRun"
    assert claim["metadata"]["annotations"]["retool.dev/retain"] == "delete"
    assert claim["spec"]["resources"]["requests"]["storage"] == "51Gi"
