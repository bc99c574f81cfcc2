"""The pure parts of the control-plane build and start (upstream/): wrapper go.mod, Kubernetes' staging
modules, pins, Kueue's conversion-webhook list, webhook rewriting, kwok's stages. The programs themselves
run in tests/e2e."""

from __future__ import annotations

import pytest

from upstream import build, cluster, pins

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
	k8s.io/api v0.0.0
	github.com/spf13/cobra v1.10.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	github.com/example/fork => github.com/example/fork v1.0.0
)
"""


def test_the_staging_modules_are_read_from_kubernetes_go_mod() -> None:
    assert build.staging_modules(KUBERNETES_GO_MOD) == ["k8s.io/api", "k8s.io/client-go"]


@pytest.mark.parametrize(
    ("kubernetes", "staging"),
    [("v1.36.3", "v0.36.3"), ("v1.30.0", "v0.30.0")],
    ids=["a 1.36 patch release publishes its staging modules as v0.36", "a .0 release too"],
)
def test_staging_modules_are_published_as_v0_of_the_same_minor_and_patch(kubernetes: str, staging: str) -> None:
    assert build.staging_version(kubernetes) == staging


@pytest.mark.parametrize("bad", ["1.36.3", "v2.0.0", "v1.36", "v1.36.3-rc.0"], ids=lambda b: f"{b} is refused")
def test_a_kubernetes_version_that_is_no_release_is_refused_by_name(bad: str) -> None:
    with pytest.raises(build.BuildError, match="KUBERNETES_VERSION"):
        build.staging_version(bad)


def test_the_kubernetes_wrapper_requires_kubernetes_and_replaces_each_staging_module_by_its_release() -> None:
    program = build.PROGRAMS["kube-apiserver"]
    text = build.wrapper_go_mod(program, "v1.36.3", staging=["k8s.io/api", "k8s.io/client-go"])
    assert text == (
        "module retool.dev/upstream-build/kube-apiserver\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.36.3\n\n"
        "replace (\n\tk8s.io/api => k8s.io/api v0.36.3\n\tk8s.io/client-go => k8s.io/client-go v0.36.3\n)\n"
    )


def test_other_wrappers_only_require_the_module() -> None:
    text = build.wrapper_go_mod(build.PROGRAMS["kueue"], "v0.19.0")
    assert "require sigs.k8s.io/kueue v0.19.0\n" in text and "replace" not in text


def test_kubernetes_binaries_carry_their_release_version() -> None:
    flags = build.ldflags(build.PROGRAMS["kube-apiserver"], "v1.36.3")
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.3" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=36" in flags
    assert "gitVersion" not in build.ldflags(build.PROGRAMS["kwok"], "v0.8.0")


def test_every_program_is_pinned_in_versions_env_and_cached_per_version(tmp_path) -> None:
    pinned = pins.pins()
    for program in build.PROGRAMS.values():
        path = build.binary_path(program, pinned, tmp_path)
        assert path.parent.name == f"{program.name}-{pinned[program.pin]}"


def test_a_cached_binary_is_not_rebuilt(tmp_path) -> None:
    program = build.PROGRAMS["kwok"]
    pinned = {"KWOK_VERSION": "v0.8.0"}
    target = build.binary_path(program, pinned, tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    assert build.build(program, pinned, root=tmp_path) == (target, None)


def test_a_missing_pin_and_an_unknown_program_are_named() -> None:
    with pytest.raises(build.BuildError, match="KUEUE_VERSION is not set"):
        build.PROGRAMS["kueue"].version({})
    with pytest.raises(build.BuildError, match=r"unknown program.*kubelet"):
        build.build_all(["kubelet"], pins={})


def test_a_build_without_go_says_what_is_needed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.BuildError, match=r"go is not on PATH.*Go >= 1.26"):
        build.build(build.PROGRAMS["kwok"], {"KWOK_VERSION": "v0.8.0"}, root=tmp_path)


def test_kueues_conversion_webhook_crds_are_its_uncommented_patches() -> None:
    kustomization = "patches:\n- path: patches/webhook_in_localqueues.yaml\n#- path: patches/webhook_in_resourceflavors.yaml\n- path: patches/webhook_in_workloads.yaml\n"
    assert cluster.conversion_webhook_crds(kustomization) == {"localqueues", "workloads"}


def test_kueues_webhooks_point_at_its_service_on_the_webhook_port_keeping_their_paths() -> None:
    doc = {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "validating-webhook-configuration"},
           "webhooks": [{"name": "vjob.kb.io", "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                                                            "path": "/validate-batch-v1-job"}}}]}
    service = {"name": "kueue-webhook-service", "namespace": "kueue-system", "port": 9443}
    out = cluster.webhook_to_service(doc, service, "kueue-")
    assert out["metadata"]["name"] == "kueue-validating-webhook-configuration"
    assert out["webhooks"][0]["clientConfig"] == {"service": {**service, "path": "/validate-batch-v1-job"}}
    assert doc["webhooks"][0]["clientConfig"]["service"]["name"] == "webhook-service", "the input is left alone"
    crd = cluster.with_conversion_webhook({"spec": {"names": {"plural": "workloads"}}}, service)
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"] == {"service": {**service, "path": "/convert"}}


def test_kwoks_pod_stages_end_a_pod_only_when_a_test_sets_its_exit_code() -> None:
    stages = {s["metadata"]["name"]: s["spec"] for s in cluster.pod_stages()}
    annotation = f'.metadata.annotations["{cluster.EXIT_CODE_ANNOTATION}"]'
    succeeded = stages["retool-e2e-pod-succeeded"]["selector"]["matchExpressions"]
    failed = stages["retool-e2e-pod-failed"]["selector"]["matchExpressions"]
    assert {"key": annotation, "operator": "In", "values": ["0"]} in succeeded
    assert {"key": annotation, "operator": "NotIn", "values": ["0"]} in failed
    assert "phase: Succeeded" in stages["retool-e2e-pod-succeeded"]["next"]["statusTemplate"]
    assert "phase: Failed" in stages["retool-e2e-pod-failed"]["next"]["statusTemplate"]
    assert stages["retool-e2e-pod-deleted"]["next"] == {"delete": True}


def test_fake_nodes_carry_gpu_feature_discovery_and_ascend_labels_and_devices() -> None:
    manifests = {n.name: cluster.node_manifest(n) for n in cluster.NODES}
    gpu = manifests["h200-0"]
    assert gpu["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    npu = manifests["ascend-0"]
    assert npu["metadata"]["labels"]["accelerator"] == "huawei-Ascend910"
    assert npu["status"]["capacity"]["huawei.com/Ascend910"] == "8"


@pytest.mark.parametrize(
    ("status", "established"),
    [
        (None, False),  # just created: the API server has not written a status yet
        ({"acceptedNames": {}, "storedVersions": ["v1"], "conditions": None}, False),  # what kubectl v1.36's wait fails on
        ({"conditions": [{"type": "NamesAccepted", "status": "True"}]}, False),
        ({"conditions": [{"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "False"}]}, False),
        ({"conditions": [{"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]}, True),
    ],
)
def test_a_crd_counts_as_established_only_once_its_condition_says_so(status, established: bool) -> None:
    crd = {"metadata": {"name": "workloads.kueue.x-k8s.io"}} | ({} if status is None else {"status": status})
    assert cluster.crd_established(crd) is established
