"""The installed KubeRay's RayJob CRD decides what the operator may start (``kuberay_crd``).

KubeRay added the worker/head group ``resources`` field in v1.5 (``WorkerGroupSpec.Resources`` /
``HeadGroupSpec.Resources`` in apis/ray/v1/raycluster_types.go, present in v1.6.1); an older CRD's
structural schema prunes it on admission, and Ray then never learns of the NPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from retool_operator.kuberay_crd import kuberay_problems, read_crd
from tests.operator.helpers import CONFIG, run_of

PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def rayjob_crd(*, group_resources: bool, preserve_at: str | None = None) -> dict[str, Any]:
    """The part of a RayJob CRD the check reads (the v1 schema down to headGroupSpec's properties);
    ``preserve_at``: the level (spec, rayClusterSpec, headGroupSpec) whose schema is cut off there
    and preserves unknown fields instead, as a trimmed CRD does."""
    head: dict[str, Any] = {"properties": {"rayStartParams": {"type": "object"}, "template": {"type": "object"}}}
    if group_resources:
        head["properties"]["resources"] = {"type": "object", "additionalProperties": {"type": "string"}}
    if preserve_at == "headGroupSpec":
        head = {**head, **PRESERVE}
    cluster: dict[str, Any] = PRESERVE if preserve_at == "rayClusterSpec" else {"properties": {"headGroupSpec": head}}
    spec: dict[str, Any] = PRESERVE if preserve_at == "spec" else {"properties": {"rayClusterSpec": cluster}}
    schema = {"properties": {"spec": spec}}
    return {
        "metadata": {"name": "rayjobs.ray.io"},
        "spec": {
            "group": "ray.io",
            "names": {"kind": "RayJob", "plural": "rayjobs", "singular": "rayjob", "listKind": "RayJobList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


CASES = [
    ("kuberay-1.4-crd-refuses-an-ascend-run", rayjob_crd(group_resources=False), "ascend", True),
    ("kuberay-1.4-crd-still-runs-nvidia-ray-detects-gpus", rayjob_crd(group_resources=False), "nvidia", False),
    ("kuberay-1.5+-crd-runs-ascend", rayjob_crd(group_resources=True), "ascend", False),
    ("no-readable-crd-refuses-nothing", None, "ascend", False),
    ("head-group-preserving-unknown-fields-keeps-resources", rayjob_crd(group_resources=False, preserve_at="headGroupSpec"), "ascend", False),
    ("ray-cluster-spec-preserving-unknown-fields-keeps-resources", rayjob_crd(group_resources=False, preserve_at="rayClusterSpec"), "ascend", False),
    ("a-trimmed-crd-preserving-the-whole-spec-keeps-resources", rayjob_crd(group_resources=False, preserve_at="spec"), "ascend", False),
]


@pytest.mark.parametrize(("crd", "accelerator", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_the_installed_kuberay_can_run(crd: dict[str, Any] | None, accelerator: str, refused: bool) -> None:
    problems = kuberay_problems(run_of(hardware={"accelerator": accelerator}), read_crd(crd), CONFIG)
    assert bool(problems) is refused
    if refused:
        assert problems[0].startswith("spec.hardware.accelerator: the KubeRay installed on this cluster") and "NPU" in problems[0]


def test_an_eval_only_ascend_run_needs_the_group_resources_field_too() -> None:
    """The eval stage is a RayJob as well (its vLLM engines need the NPUs Ray must be told of): a run
    with only eval enabled is refused on an old CRD, and runs on a new one."""
    run = run_of(hardware={"accelerator": "ascend"}, sft={"enabled": False}, rl={"enabled": False})
    assert kuberay_problems(run, read_crd(rayjob_crd(group_resources=False)), CONFIG)
    assert not kuberay_problems(run, read_crd(rayjob_crd(group_resources=True)), CONFIG)
