"""The manifest checker itself: it fails loudly without its inputs and finds what the API server
would refuse or silently prune."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.manifest_check import MissingSchemasError, crd_schemas, problems, pruned_fields
from upstream.pins import kuberay_version


def test_missing_kuberay_crds_are_an_error_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MissingSchemasError, match=r"no KubeRay CRDs in .*: run `make kuberay-crds`"):
        crd_schemas(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingSchemasError, match="make kuberay-crds"):
        problems([{"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"}}], schemas_dir=tmp_path / "empty")


def test_the_pinned_crds_serve_rayjob_and_raycluster() -> None:
    assert {("ray.io/v1", "RayJob"), ("ray.io/v1", "RayCluster")} <= set(crd_schemas())


SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "known": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": True, "properties": {"spec": {"type": "object", "properties": {}}}},
            },
        }
    },
}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"apiVersion": "v", "kind": "K", "metadata": {}, "spec": {"known": "a"}}, []),
        ({"spec": {"knwon": "a"}}, [".spec.knwon"]),
        ({"spec": {"labels": {"any": "thing"}}}, []),
        ({"spec": {"free": {"anything": {"deep": 1}}}}, []),
        ({"spec": {"items": [{"name": "a"}, {"nam": "b"}]}}, [".spec.items[1].nam"]),
        ({"spec": {"template": {"metadata": {"labels": {}}, "spec": {"x": 1}}}}, [".spec.template.spec.x"]),
        ({"spec": {"known": "a"}, "status": {}}, [".status"]),
    ],
    ids=[
        "root fields and known fields are kept",
        "a misspelt field is pruned",
        "map values are kept",
        "preserve-unknown-fields keeps everything below",
        "unknown fields inside list items are found with their index",
        "an embedded resource keeps its metadata but not unknown spec fields",
        "a field the schema does not have at the root is pruned",
    ],
)
def test_pruned_fields(obj: dict, expected: list[str]) -> None:
    assert pruned_fields(obj, SCHEMA) == expected


def test_core_kinds_are_checked_strictly_and_unknown_ray_kinds_reported() -> None:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    assert problems([configmap]) == []
    assert problems([{**configmap, "dta": {}}]) != []
    unknown = {"apiVersion": "ray.io/v1", "kind": "RayThing", "metadata": {"name": "t"}}
    assert problems([unknown]) == [f"RayThing/t: ray.io/v1 RayThing is not served by KubeRay {kuberay_version()}"]
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"}, "spec": {"entrypoint": "x", "shutdownAfterJobFinish": True}}
    assert problems([rayjob]) == ["RayJob/j: unknown field .spec.shutdownAfterJobFinish (would be pruned)"]
