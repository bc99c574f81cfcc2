"""Specs that are valid in shape but absurd in size are refused, with the field and the bound named.

Each bound is what the cluster or a program downstream accepts: KubeRay's int32 seconds fields,
the sandbox server's per-replica ceiling, Kubernetes' largest quantity, finite floats for verl.
"""

from __future__ import annotations

import math

import pytest
import yaml

from retool.spec import model
from retool.spec.crd import build_crd
from retool.spec.validate import validate_document
from tests.spec.test_validate import with_spec

ABSURD = [
    # (id, changes, field path, fragment of the message)
    (
        "100000 sandbox replicas",
        {"sandbox__maxConcurrent": 100000, "sandbox__perReplicaConcurrency": 1},
        "spec.sandbox.maxConcurrent",
        "need 100000 sandbox replicas; at most 1024",
    ),
    (
        "more concurrency per replica than the server runs",
        {"sandbox__perReplicaConcurrency": 1024, "sandbox__maxConcurrent": 2048},
        "spec.sandbox.perReplicaConcurrency",
        "less than or equal to 512",
    ),
    ("an execution memory limit below the server's floor", {"sandbox__memoryLimitMB": 8}, "spec.sandbox.memoryLimitMB", "greater than or equal to 16"),
    ("a stage deadline beyond int32", {"failurePolicy__stageDeadlineSeconds": 10**30}, "spec.failurePolicy.stageDeadlineSeconds", "less than or equal to 2147483647"),
    ("a cluster grace beyond ten minutes", {"failurePolicy__clusterGraceSeconds": 601}, "spec.failurePolicy.clusterGraceSeconds", "less than or equal to 600"),
    (
        "tolerationSeconds beyond int64",
        {"hardware__tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**63}]},
        "spec.hardware.tolerations[0].tolerationSeconds",
        "less than or equal to 9223372036854775807",
    ),
    ("an infinite KL coefficient", {"rl__klCoef": math.inf}, "spec.rl.klCoef", "finite number"),
    ("a NaN learning rate", {"rl__learningRate": math.nan}, "spec.rl.learningRate", "finite number"),
    ("an infinite entropy coefficient", {"rl__entropyCoeff": math.inf}, "spec.rl.entropyCoeff", "finite number"),
    ("an infinite sandbox timeout", {"sandbox__timeoutSeconds": math.inf}, "spec.sandbox.timeoutSeconds", "finite number"),
    ("10^18 training steps", {"rl__steps": 10**18}, "spec.rl.steps", "less than or equal to 1000000"),
    ("a response length beyond a million tokens", {"rl__maxResponseLength": 2**40}, "spec.rl.maxResponseLength", "less than or equal to 1048576"),
    ("a batch beyond a million prompts", {"rl__batchSize": 2**40, "rl__miniBatchSize": 64}, "spec.rl.batchSize", "less than or equal to 1048576"),
    ("a tensor-parallel size beyond any node", {"rl__tensorParallel": 2**31}, "spec.rl.tensorParallel", "less than or equal to 1024"),
    ("a cpu of 1e400", {"hardware__resources": {"requests": {"cpu": "1e400"}}}, "spec.hardware.resources.requests.cpu", "larger than Kubernetes can represent"),
    ("a memory of 8Ei", {"sandbox__resources": {"limits": {"memory": "8Ei"}}}, "spec.sandbox.resources.limits.memory", "larger than Kubernetes can represent"),
    ("an infinite float quantity", {"hardware__sharedMemory": math.inf}, "spec.hardware.sharedMemory", "not a Kubernetes quantity"),
    ("a quantity of a thousand digits", {"hardware__resources": {"limits": {"cpu": "1" * 1000}}}, "spec.hardware.resources.limits.cpu", "characters is not a Kubernetes quantity"),
    ("a malformed share above one", {"data__maxMalformedFraction": 1.5}, "spec.data.maxMalformedFraction", "less than or equal to 1"),
]


@pytest.mark.parametrize(("changes", "path", "fragment"), [c[1:] for c in ABSURD], ids=[c[0] for c in ABSURD])
def test_absurd_values_are_refused_naming_the_field(changes: dict, path: str, fragment: str) -> None:
    problems = validate_document(with_spec(**changes))
    assert [p.path for p in problems] == [path], problems
    assert fragment in problems[0].message


EDGES = [
    (
        "the server's largest replica",
        {"sandbox__perReplicaConcurrency": 512, "sandbox__maxConcurrent": 512, "sandbox__memoryLimitMB": 16, "sandbox__resources": {"limits": {"memory": "8Gi"}}},
    ),
    ("exactly 1024 replicas", {"sandbox__maxConcurrent": 16384, "sandbox__perReplicaConcurrency": 16}),
    ("a week-long stage and ten minutes of cluster grace", {"failurePolicy__stageDeadlineSeconds": 7 * 86400, "failurePolicy__clusterGraceSeconds": 600}),
    ("the largest int32 deadline", {"failurePolicy__stageDeadlineSeconds": 2**31 - 1}),
    ("a cpu of 64 and a memory of 1Ti", {"hardware__resources": {"requests": {"cpu": 64, "memory": "1Ti"}}}),
    ("a KL coefficient of 0.001", {"rl__useKlInReward": True, "rl__klCoef": 0.001}),
]


@pytest.mark.parametrize("changes", [c[1] for c in EDGES], ids=[c[0] for c in EDGES])
def test_large_but_real_values_are_admitted(changes: dict) -> None:
    assert validate_document(with_spec(**changes)) == []


def test_the_yaml_spellings_of_inf_and_nan_are_refused() -> None:
    document = yaml.safe_load(yaml.safe_dump(with_spec()).replace("claimName: retool-data", "claimName: retool-data\n  rl: {klCoef: .inf, klLossCoef: .nan}"))
    assert sorted(p.path for p in validate_document(document)) == ["spec.rl.klCoef", "spec.rl.klLossCoef"]


def test_the_sandbox_bounds_are_the_sandbox_servers() -> None:
    """perReplicaConcurrency becomes the server's --workers and memoryLimitMB its default memory limit."""
    from retool.sandbox import settings

    fields = settings.SandboxSettings.model_fields

    def bound(field: str, name: str) -> int:
        return next(getattr(m, name) for m in fields[field].metadata if hasattr(m, name))

    assert bound("workers", "le") == model.SANDBOX_MAX_WORKERS
    assert bound("default_memory_limit_mb", "ge") <= model.SANDBOX_MIN_MEMORY_MB
    assert bound("max_memory_limit_mb", "ge") <= model.SANDBOX_MIN_MEMORY_MB


def test_the_crd_carries_the_bounds_to_the_api_server() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["sandbox"]["properties"]["perReplicaConcurrency"]["maximum"] == 512
    assert spec["failurePolicy"]["properties"]["stageDeadlineSeconds"]["maximum"] == 2**31 - 1
    assert spec["rl"]["properties"]["steps"]["maximum"] == model.MAX_STEPS
