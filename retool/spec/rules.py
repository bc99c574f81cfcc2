"""Rules that span several fields of a RetoolRun.

Each rule is a small pure function returning problems with the path of the field to fix, so
``retool validate``, the admission webhook and the operator report the same messages. They
encode what verl would otherwise discover hours into a run (a batch that does not split across
data-parallel ranks, a tensor-parallel size that does not fit a node) or what would break the
cluster objects (a sandbox replica too small for its executions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from retool.spec.model import RetoolRun, RetoolRunSpec
from retool.spec.names import run_name_problems
from retool.spec.quantity import parse_quantity


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the dotted field path and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def sandbox_replicas(spec: RetoolRunSpec) -> int:
    """Replicas of the sandbox Deployment: enough for maxConcurrent executions in flight."""
    return math.ceil(spec.sandbox.max_concurrent / spec.sandbox.per_replica_concurrency)


def total_devices(spec: RetoolRunSpec) -> int:
    return spec.hardware.nodes * spec.hardware.devices_per_node


def _divides(problems: list[Problem], path: str, size: int, devices: int, what: str) -> None:
    if devices % size:
        problems.append(Problem(path, f"{size} must divide the {devices} {what}"))


def _parallelism(spec: RetoolRunSpec) -> list[Problem]:
    devices = total_devices(spec)
    per_node = spec.hardware.devices_per_node
    problems: list[Problem] = []
    _divides(problems, "spec.rl.sequenceParallel", spec.rl.sequence_parallel, devices, "devices (hardware.nodes x hardware.devicesPerNode)")
    _divides(problems, "spec.rl.tensorParallel", spec.rl.tensor_parallel, per_node, "devices of one node (hardware.devicesPerNode); rollout engines do not span nodes")
    if spec.sft.enabled:
        _divides(problems, "spec.sft.sequenceParallel", spec.sft.sequence_parallel, devices, "devices (hardware.nodes x hardware.devicesPerNode)")
    return problems


def _rl_batches(spec: RetoolRunSpec) -> list[Problem]:
    rl = spec.rl
    problems: list[Problem] = []
    if rl.mini_batch_size > rl.batch_size:
        problems.append(Problem("spec.rl.miniBatchSize", f"{rl.mini_batch_size} is larger than rl.batchSize ({rl.batch_size})"))
    elif rl.batch_size % rl.mini_batch_size:
        problems.append(Problem("spec.rl.batchSize", f"{rl.batch_size} must be divisible by rl.miniBatchSize ({rl.mini_batch_size})"))
    if rl.sequence_parallel <= total_devices(spec) and total_devices(spec) % rl.sequence_parallel == 0:
        data_parallel = total_devices(spec) // rl.sequence_parallel
        responses = rl.mini_batch_size * rl.rollout_n
        if responses % data_parallel:
            problems.append(
                Problem(
                    "spec.rl.miniBatchSize",
                    f"miniBatchSize x rolloutN = {responses} responses must split evenly over {data_parallel} data-parallel ranks (devices / rl.sequenceParallel)",
                )
            )
    return problems


def _sft_batches(spec: RetoolRunSpec) -> list[Problem]:
    sft = spec.sft
    if not sft.enabled or total_devices(spec) % sft.sequence_parallel:
        return []
    data_parallel = total_devices(spec) // sft.sequence_parallel
    if sft.batch_size % data_parallel:
        return [Problem("spec.sft.batchSize", f"{sft.batch_size} must be divisible by the {data_parallel} data-parallel ranks (devices / sft.sequenceParallel)")]
    per_rank = sft.batch_size // data_parallel
    if per_rank % sft.micro_batch_size_per_device:
        return [
            Problem(
                "spec.sft.microBatchSizePerDevice",
                f"{sft.micro_batch_size_per_device} must divide the {per_rank} trajectories each data-parallel rank gets per step (sft.batchSize / {data_parallel})",
            )
        ]
    return []


def _clip_ratios(spec: RetoolRunSpec) -> list[Problem]:
    rl = spec.rl
    problems = []
    if rl.clip_ratio_high < rl.clip_ratio_low:
        problems.append(Problem("spec.rl.clipRatioHigh", f"{rl.clip_ratio_high} is below rl.clipRatioLow ({rl.clip_ratio_low})"))
    return problems


def _stages(spec: RetoolRunSpec) -> list[Problem]:
    if not (spec.sft.enabled or spec.rl.enabled or spec.eval.enabled):
        return [Problem("spec", "sft, rl and eval are all disabled: the run would do nothing")]
    return []


def _storage(spec: RetoolRunSpec) -> list[Problem]:
    if spec.storage.pvc is None:
        return [Problem("spec.storage.pvc", "a PVC is required: stages hand data, checkpoints and merged models to each other through it (storage.s3 is an optional mirror)")]
    return []


def _sandbox(spec: RetoolRunSpec) -> list[Problem]:
    sandbox = spec.sandbox
    problems = []
    if sandbox.per_replica_concurrency > sandbox.max_concurrent:
        problems.append(
            Problem("spec.sandbox.perReplicaConcurrency", f"{sandbox.per_replica_concurrency} is larger than sandbox.maxConcurrent ({sandbox.max_concurrent})")
        )
    limit = sandbox.resources.limits.get("memory")
    needed = sandbox.per_replica_concurrency * sandbox.memory_limit_mb * 2**20
    if limit is not None and parse_quantity(limit) < needed:
        problems.append(
            Problem(
                "spec.sandbox.resources.limits.memory",
                f"{limit} cannot hold perReplicaConcurrency x memoryLimitMB = {sandbox.per_replica_concurrency} x {sandbox.memory_limit_mb}Mi; "
                "legitimate executions would get the replica OOM-killed",
            )
        )
    for key in sorted(set(sandbox.resources.requests) & set(sandbox.resources.limits)):
        if parse_quantity(sandbox.resources.requests[key]) > parse_quantity(sandbox.resources.limits[key]):
            problems.append(Problem(f"spec.sandbox.resources.requests.{key}", "request is larger than the limit"))
    return problems


def _hardware(spec: RetoolRunSpec) -> list[Problem]:
    problems = []
    resources = spec.hardware.resources
    for key in sorted(set(resources.requests) & set(resources.limits)):
        if parse_quantity(resources.requests[key]) > parse_quantity(resources.limits[key]):
            problems.append(Problem(f"spec.hardware.resources.requests.{key}", "request is larger than the limit"))
    names = [d.name for d in spec.data.eval]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(Problem(f"spec.data.eval[{i}].name", f"{name!r} is used twice; eval set names must be unique"))
    return problems


SPEC_RULES: tuple[Callable[[RetoolRunSpec], list[Problem]], ...] = (
    _parallelism,
    _rl_batches,
    _sft_batches,
    _clip_ratios,
    _stages,
    _storage,
    _sandbox,
    _hardware,
)


def check_rules(run: RetoolRun) -> list[Problem]:
    """All cross-field problems of a structurally valid RetoolRun."""
    problems = [Problem("metadata.name", message) for message in run_name_problems(run.metadata.name)]
    for rule in SPEC_RULES:
        problems.extend(rule(run.spec))
    return problems
