"""Every manifest the builders produce is valid: core kinds against the Kubernetes OpenAPI schema
(kubernetes-validate --strict, in-process), Ray kinds against the KubeRay v1.7.0 CRD schemas with
the shared check tool's logic (defaults, types, enums, and fields the API server would prune).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from retool_operator.builders import build_mlflow
from retool_operator.render import desired_objects

from tests.conftest import EXAMPLES, KUBERAY_SCHEMAS, REPO
from tests.operator.helpers import CONFIG, document

CHECK_TOOL = REPO.parent / "shared" / "tools" / "check_manifests.py"
K8S_VERSION = "1.33.0"

pytestmark = pytest.mark.skipif(not CHECK_TOOL.exists() or not KUBERAY_SCHEMAS.exists(), reason="shared schemas and check tool not present")


def _check_tool() -> Any:
    spec = importlib.util.spec_from_file_location("check_manifests", CHECK_TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ray_schemas() -> dict[tuple[str, str], dict]:
    return _check_tool().crd_schemas(str(KUBERAY_SCHEMAS))


def problems_of(objects: list[dict[str, Any]], ray_schemas: dict, tmp_path: Path) -> list[str]:
    """The same checks as check_manifests.py, on one multi-document file per case."""
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    tool = _check_tool()
    found: list[str] = []
    for obj in yaml.safe_load_all(path.read_text()):
        key = (obj["apiVersion"], obj["kind"])
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in ray_schemas:
            found += [f"{name}: {'.'.join(map(str, e.path))}: {e.message[:160]}" for e in jsonschema.Draft7Validator(ray_schemas[key]).iter_errors(obj)]
            found += [f"{name}: unknown field {p} (would be pruned)" for p in tool.pruned(obj, ray_schemas[key])]
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                found.append(f"{name}: {err.message[:200]}")
    return found


VARIANTS = {
    "nvidia-one-node": {},
    "nvidia-two-nodes-product-deadline": {"hardware": {"nodes": 2, "product": "NVIDIA-H200"}, "failurePolicy": {"stageDeadlineSeconds": 3600}},
    "ascend-one-node": {"hardware": {"accelerator": "ascend"}},
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
    assert problems_of(desired_objects(doc, config=CONFIG), ray_schemas, tmp_path) == []


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
