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

from retool.spec.model import MAX_SANDBOX_REPLICAS, ResourceRequirements, RetoolRun, RetoolRunSpec
from retool.spec.names import run_name_problems
from retool.spec.pod_rules import pod_problems
from retool.spec.problem import Problem
from retool.spec.quantity import parse_quantity


def sandbox_replicas(spec: RetoolRunSpec) -> int:
    """Replicas of the sandbox Deployment: enough for maxConcurrent executions in flight."""
    return math.ceil(spec.sandbox.max_concurrent / spec.sandbox.per_replica_concurrency)


def total_devices(spec: RetoolRunSpec) -> int:
    return spec.hardware.nodes * spec.hardware.devices_per_node


def _hardware_path(spec: RetoolRunSpec) -> str:
    """The device-count field the user wrote (devicesPerNode unless only nodes was written)."""
    written = spec.hardware.model_fields_set
    return "spec.hardware.nodes" if "nodes" in written and "devices_per_node" not in written else "spec.hardware.devicesPerNode"


def _setting(spec: RetoolRunSpec, section: str, field: str) -> tuple[str, bool]:
    """(``section.alias``, whether the user wrote it) of a stage setting, e.g. ("rl.sequenceParallel", False)."""
    model = getattr(spec, section)
    alias = type(model).model_fields[field].alias or field
    return f"{section}.{alias}", field in model.model_fields_set


def _divides(problems: list[Problem], spec: RetoolRunSpec, section: str, field: str, devices: int, what: str, counted: str) -> None:
    """``section.field`` must divide ``devices``. A value the user wrote is the field to fix; a default
    that does not fit the devices the user asked for names the device count (the field they wrote)
    and the setting to add, with the largest value that fits."""
    size = getattr(getattr(spec, section), field)
    if devices % size == 0:
        return
    name, written = _setting(spec, section, field)
    if written:
        problems.append(Problem(f"spec.{name}", f"{size} must divide the {devices} {what}"))
        return
    fits = max(d for d in range(1, size + 1) if devices % d == 0)
    problems.append(Problem(_hardware_path(spec), f"{devices} {counted}: the default {name} ({size}) must divide them; set spec.{name}, e.g. to {fits}"))


def _parallelism(spec: RetoolRunSpec) -> list[Problem]:
    devices = total_devices(spec)
    per_node = spec.hardware.devices_per_node
    problems: list[Problem] = []
    in_all = "devices (hardware.nodes x hardware.devicesPerNode)"
    _divides(problems, spec, "rl", "sequence_parallel", devices, in_all, "devices in all")
    _divides(problems, spec, "rl", "tensor_parallel", per_node, "devices of one node (hardware.devicesPerNode); rollout engines do not span nodes", "devices per node")
    if spec.sft.enabled:
        _divides(problems, spec, "sft", "sequence_parallel", devices, in_all, "devices in all")
    return problems


def _rl_batches(spec: RetoolRunSpec) -> list[Problem]:
    rl = spec.rl
    problems: list[Problem] = []
    if rl.mini_batch_size > rl.batch_size:
        problems.append(Problem("spec.rl.miniBatchSize", f"{rl.mini_batch_size} is larger than rl.batchSize ({rl.batch_size})"))
    elif rl.batch_size % rl.mini_batch_size:
        problems.append(Problem("spec.rl.batchSize", f"{rl.batch_size} must be divisible by rl.miniBatchSize ({rl.mini_batch_size})"))
    split = len(problems)
    if rl.sequence_parallel <= total_devices(spec) and total_devices(spec) % rl.sequence_parallel == 0:
        data_parallel = total_devices(spec) // rl.sequence_parallel
        responses = rl.mini_batch_size * rl.rollout_n
        if responses % data_parallel:
            written = rl.model_fields_set & {"mini_batch_size", "rollout_n", "sequence_parallel"}
            path = "spec.rl.miniBatchSize" if written else _hardware_path(spec)
            defaults = "" if written else " (the defaults: set rl.miniBatchSize, rl.rolloutN or rl.sequenceParallel to fit the devices)"
            problems.append(
                Problem(
                    path,
                    f"miniBatchSize x rolloutN = {responses} responses must split evenly over {data_parallel} data-parallel ranks (devices / rl.sequenceParallel){defaults}",
                )
            )
    responses_per_step = rl.batch_size * rl.rollout_n
    if responses_per_step % total_devices(spec) and len(problems) == split:
        # verl's validate_config (verl/utils/config.py, 0.6.1): data.train_batch_size x rollout.n
        # must be divisible by the GPU count (FSDP's minimal batch), asserted when main_ppo starts.
        # Reported only when the mini-batch split above is fine (with sequenceParallel 1 that one implies it).
        written = rl.model_fields_set & {"batch_size", "rollout_n"}
        path = "spec.rl.batchSize" if written else _hardware_path(spec)
        defaults = "" if written else " (the defaults: set rl.batchSize or rl.rolloutN to fit the devices)"
        problems.append(
            Problem(
                path,
                f"batchSize x rolloutN = {rl.batch_size} x {rl.rollout_n} = {responses_per_step} responses per step must be a multiple of the "
                f"{total_devices(spec)} devices (hardware.nodes x hardware.devicesPerNode): verl splits every step's responses over all of them{defaults}",
            )
        )
    return problems


def _sft_batches(spec: RetoolRunSpec) -> list[Problem]:
    sft = spec.sft
    if not sft.enabled or total_devices(spec) % sft.sequence_parallel:
        return []
    data_parallel = total_devices(spec) // sft.sequence_parallel
    if sft.batch_size % data_parallel:
        written = sft.model_fields_set & {"batch_size", "sequence_parallel"}
        path, defaults = ("spec.sft.batchSize", "") if written else (_hardware_path(spec), " (the defaults: set sft.batchSize or sft.sequenceParallel to fit the devices)")
        return [Problem(path, f"sft.batchSize {sft.batch_size} must be divisible by the {data_parallel} data-parallel ranks (devices / sft.sequenceParallel){defaults}")]
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


def _reward_watch(spec: RetoolRunSpec) -> list[Problem]:
    watch = spec.rl.reward_watch
    if watch.benign_rate + watch.shift >= 1:
        return [Problem("spec.rl.rewardWatch.shift", f"benignRate + shift must be below 1 (the alarm's alternative rate), got {watch.benign_rate} + {watch.shift}")]
    return []


def _stages(spec: RetoolRunSpec) -> list[Problem]:
    if not (spec.sft.enabled or spec.rl.enabled or spec.eval.enabled):
        return [Problem("spec", "sft, rl and eval are all disabled: the run would do nothing")]
    return []


def _storage(spec: RetoolRunSpec) -> list[Problem]:
    pvc, problems = spec.storage.pvc, []
    if pvc.claim_name is not None:
        for field, value in (("size", pvc.size), ("storageClassName", pvc.storage_class_name), ("accessModes", pvc.access_modes)):
            if value is not None:
                problems.append(
                    Problem(
                        f"spec.storage.pvc.{field}",
                        f"describes the claim the operator creates, but claimName names an existing claim ({pvc.claim_name}); remove one of them",
                    )
                )
        if spec.storage.retain == "delete":
            problems.append(Problem("spec.storage.retain", f"delete applies to a claim the operator creates; the existing claim {pvc.claim_name} is never deleted by the operator"))
    if pvc.size is not None and parse_quantity(pvc.size) <= 0:
        problems.append(Problem("spec.storage.pvc.size", f"{pvc.size} must be larger than zero"))
    if spec.hardware.nodes > 1 and pvc.access_modes is not None and "ReadWriteMany" not in pvc.access_modes:
        problems.append(
            Problem(
                "spec.storage.pvc.accessModes",
                f"hardware.nodes is {spec.hardware.nodes}: pods on every node mount the claim at once (Ray workers read what the head writes), which needs ReadWriteMany",
            )
        )
    return problems


def _scheduling(spec: RetoolRunSpec) -> list[Problem]:
    scheduling, problems = spec.scheduling, []
    if scheduling.queue_name and scheduling.gang.enabled:
        problems.append(
            Problem(
                "spec.scheduling.gang.enabled",
                "cannot be combined with queueName: Kueue admits a stage's whole workload at once (quota for the head and every worker), "
                "and a batch scheduler beside it would queue the run twice; use queueName (Kueue) or gang (Volcano/YuniKorn), not both",
            )
        )
    if scheduling.workload_priority_class_name and not scheduling.queue_name:
        problems.append(Problem("spec.scheduling.workloadPriorityClassName", "is a Kueue priority and needs scheduling.queueName"))
    if scheduling.gang.queue and not scheduling.gang.enabled:
        problems.append(Problem("spec.scheduling.gang.queue", "has no effect unless scheduling.gang.enabled is true"))
    return problems


def _rollout_engine(spec: RetoolRunSpec) -> list[Problem]:
    """A value the schema names for verl's sake, refused until an image runs it (retool.runtime.image_contract)."""
    if spec.rl.rollout_engine == "sglang":
        return [
            Problem(
                "spec.rl.rolloutEngine",
                "sglang is not supported: no ReTool trainer image installs SGLang (trainer-cuda ships vLLM 0.11.0, trainer-ascend vllm-ascend), "
                "so the rollout workers would fail to import it; use vllm",
            )
        ]
    return []


def _cpu_rehearsal(spec: RetoolRunSpec) -> list[Problem]:
    """hardware.accelerator cpu and rl.rolloutEngine hf go together, on the 0.9 line (docs/rehearsal.md)."""
    problems = []
    cpu, hf = spec.hardware.accelerator == "cpu", spec.rl.rollout_engine == "hf"
    if cpu and not hf:
        problems.append(Problem("spec.rl.rolloutEngine", f"is {spec.rl.rollout_engine}, which needs a GPU or NPU; hardware.accelerator cpu rehearses with hf"))
    if hf and not cpu:
        problems.append(
            Problem("spec.rl.rolloutEngine", f"hf is the CPU rehearsal engine (no paged KV cache, no tensor parallelism): use vllm on {spec.hardware.accelerator}")
        )
    if cpu and spec.trainer.verl != "0.9.1":
        problems.append(
            Problem(
                "spec.trainer.verl",
                f'is {spec.trainer.verl}; hardware.accelerator cpu runs on the 0.9 line only ("0.9.1": its platform and rollout registries, docs/verl-lines.md)',
            )
        )
    return problems


def _recipe(spec: RetoolRunSpec) -> list[Problem]:
    if spec.recipe != "text-only":
        return []
    problems = []
    if spec.sft.enabled:
        problems.append(
            Problem(
                "spec.sft.enabled",
                "recipe text-only trains without the code interpreter, but the cold-start SFT teaches code-interpreter calls; "
                "set sft.enabled: false (the paper's text-based RL baseline starts from the instruct model)",
            )
        )
    if spec.rl.tool_turn_shaping:
        problems.append(Problem("spec.rl.toolTurnShaping", "shapes the reward by tool turns, which a text-only run has none of"))
    return problems


def _requests_within_limits(resources: ResourceRequirements, path: str) -> list[Problem]:
    """A request above the limit of the same resource (Kubernetes refuses such a pod)."""
    return [
        Problem(f"{path}.requests.{key}", "request is larger than the limit")
        for key in sorted(set(resources.requests) & set(resources.limits))
        if parse_quantity(resources.requests[key]) > parse_quantity(resources.limits[key])
    ]


def sandbox_replica_problem(spec: RetoolRunSpec, cap: int = MAX_SANDBOX_REPLICAS, setting: str = "") -> Problem | None:
    """The run asks for more sandbox replicas than ``cap`` (the contract's, or the operator's ``setting``)."""
    replicas = sandbox_replicas(spec)
    if replicas <= cap:
        return None
    where = f" (operator setting {setting})" if setting else ""
    return Problem(
        "spec.sandbox.maxConcurrent",
        f"{spec.sandbox.max_concurrent} executions at {spec.sandbox.per_replica_concurrency} per replica need {replicas} sandbox replicas; "
        f"at most {cap} are allowed{where}: lower maxConcurrent or raise perReplicaConcurrency",
    )


def _sandbox(spec: RetoolRunSpec) -> list[Problem]:
    sandbox = spec.sandbox
    problems = []
    too_many = sandbox_replica_problem(spec)
    if too_many is not None:
        problems.append(too_many)
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
    problems.extend(_requests_within_limits(sandbox.resources, "spec.sandbox.resources"))
    return problems


def _hardware(spec: RetoolRunSpec) -> list[Problem]:
    problems = _requests_within_limits(spec.hardware.resources, "spec.hardware.resources")
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
    _reward_watch,
    _stages,
    _storage,
    _scheduling,
    _recipe,
    _rollout_engine,
    _cpu_rehearsal,
    pod_problems,
    _sandbox,
    _hardware,
)


def check_rules(run: RetoolRun) -> list[Problem]:
    """All cross-field problems of a structurally valid RetoolRun."""
    problems = [Problem("metadata.name", message) for message in run_name_problems(run.metadata.name)]
    for rule in SPEC_RULES:
        problems.extend(rule(run.spec))
    return problems
