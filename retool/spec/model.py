"""The RetoolRun resource: the one definition every component reads.

The CRD's schema is generated from these models (``make crd``), the admission webhook and the
operator parse with them, and ``retool validate`` reports their errors, so a field exists once
with its description, default and bounds. Defaults are the public ReTool recipe for
Qwen2.5-32B-Instruct on one 8xH200 node (verl ``recipe/retool``, run_qwen2-32b_sft.sh and
run_qwen2-32b_dapo.sh). Rules that span several fields live in ``rules.py``.

Python attributes are snake_case; the YAML and the CRD use the camelCase aliases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from retool.spec.base import K8S_NAME_PATTERN, K8sName, SpecModel
from retool.spec.pods import LabelValue, PodSettingsSpec
from retool.spec.quantity import Quantity

API_GROUP = "retool.dev"
API_VERSION = "v1alpha1"
KIND = "RetoolRun"
PLURAL = "retoolruns"

# Where a model, a data set or a checkpoint can come from. A hub id is ``org/name``; ``s3://``
# is read with boto3; an absolute path is read from the run's PVC (mounted at the same path).
SOURCE_PATTERN = (
    r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?"
    r"|/[^\s]*"
    r"|[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)$"
)
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$"
HTTP_URL_PATTERN = r"^https?://[^\s/]+(/[^\s]*)?$"
IMAGE_PATTERN = r"^[^\s]+$"

Source = Annotated[str, StringConstraints(pattern=SOURCE_PATTERN, max_length=1024)]
Image = Annotated[str, StringConstraints(pattern=IMAGE_PATTERN, min_length=1, max_length=512)]
PositiveInt = Annotated[int, Field(ge=1)]

# Bounds that match what the cluster and the programs downstream accept, so an absurd value is
# refused at admission instead of failing (or crash-looping) later.
INT32_MAX = 2**31 - 1
"""KubeRay's RayJob activeDeadlineSeconds/ttlSecondsAfterFinished and a Job's ttlSecondsAfterFinished are int32."""
INT64_MAX = 2**63 - 1
"""A toleration's tolerationSeconds is int64."""
MAX_STEPS = 1_000_000
MAX_BATCH = 1 << 20
MAX_TOKENS = 1 << 20
MAX_PARALLEL = 1024
"""No parallel size exceeds the devices of the largest run (64 nodes x 16 devices)."""
SANDBOX_MAX_WORKERS = 512
"""The sandbox server's ceiling on concurrent executions per replica (``retool.sandbox.settings`` ``workers``)."""
SANDBOX_MIN_MEMORY_MB = 16
"""The sandbox server's floor on an execution's memory limit (``default_memory_limit_mb``)."""
MAX_SANDBOX_REPLICAS = 1024
"""Sandbox replicas one run may ask for at most (the operator's ``sandboxMaxReplicas`` may lower it)."""


class HubTokenSecretRef(SpecModel):
    name: K8sName = Field(..., description="Secret in the run's namespace.")
    key: str = Field("HF_TOKEN", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Key of the Hugging Face token in the Secret.")


class ModelSpec(SpecModel):
    base: Source = Field(
        "Qwen/Qwen2.5-32B-Instruct",
        description=(
            "Base model to train: a Hugging Face id (org/name), an s3:// URI, or an absolute path on the run's PVC. "
            "The prepare stage stages a hub or s3:// model once onto the run's PVC (verified); every later stage reads that copy."
        ),
    )
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=r"^[^\s]+$",
        description="Hub revision (branch, tag or commit) of a Hugging Face id; staging resolves it to a commit and records it.",
    )
    hub_endpoint: str | None = Field(
        None,
        pattern=HTTP_URL_PATTERN,
        description="Hugging Face Hub endpoint to download from (HF_ENDPOINT), e.g. a mirror for clusters that cannot reach huggingface.co; also used for hub data sets.",
    )
    token_secret_ref: HubTokenSecretRef | None = Field(
        None, description="Secret holding a Hugging Face token (gated or private models and data sets); given to the prepare stage as HF_TOKEN."
    )
    size_billions: float | None = Field(
        None,
        gt=0,
        le=2000,
        description="Parameter count in billions. Selects the parallelism profile; when unset it is read from the model name (e.g. '32B').",
    )
    trust_remote_code: bool = Field(False, description="Let transformers run code shipped with the model.")


class Toleration(SpecModel):
    key: str | None = Field(None, description="Taint key the toleration applies to; empty with operator Exists matches all taints.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(None, ge=0, le=INT64_MAX, description="How long a NoExecute taint is tolerated.")


class ResourceRequirements(SpecModel):
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Minimum resources (cpu, memory, ...), Kubernetes quantities.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Maximum resources (cpu, memory, ...), Kubernetes quantities.")


class HardwareSpec(SpecModel):
    accelerator: Literal["nvidia", "ascend", "cpu"] = Field(
        "nvidia",
        description=(
            "Device family of the trainer nodes: nvidia (CUDA GPUs) or ascend (Huawei Ascend NPUs); cpu is a rehearsal on CPU nodes "
            "(a tiny model through every stage's own command: gloo, eager attention, the hf rollout engine; trainer.verl 0.9.1 and "
            "rl.rolloutEngine hf; docs/rehearsal.md), where devicesPerNode counts training processes."
        ),
    )
    product: str | None = Field(
        None,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description=(
            "nvidia: the GPU feature discovery value of the node label nvidia.com/gpu.product to schedule on, "
            "e.g. NVIDIA-H200 or NVIDIA-H100-80GB-HBM3 (the GPU name with spaces as dashes; H200 alone matches no node). "
            "Unknown values are accepted with a warning naming the closest known one. Optional."
        ),
    )
    nodes: PositiveInt = Field(1, le=64, description="Number of trainer nodes (one Ray head plus nodes-1 workers).")
    devices_per_node: PositiveInt = Field(8, le=16, description="Accelerator devices used on each node.")
    device_resource_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$",
        description="Extended resource name of the device; defaults to nvidia.com/gpu or the operator's Ascend resource (huawei.com/Ascend910).",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels the trainer pods require; merged over the profile's.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Extra tolerations of the trainer pods; added to the profile's.")
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory of each trainer pod (devices are added from devicesPerNode). Empty uses the profile's defaults.",
    )
    shared_memory: Quantity = Field("64Gi", description="Size of the in-memory /dev/shm of trainer pods (Ray object store, NCCL/HCCL).")
    image: Image | None = Field(None, description="Trainer image override; defaults to the operator's image for the accelerator.")


class SecretKeyRef(SpecModel):
    name: K8sName = Field(..., description="Secret in the run's namespace.")
    access_key_id_key: str = Field("AWS_ACCESS_KEY_ID", description="Key of the access key id in the Secret.")
    secret_access_key_key: str = Field("AWS_SECRET_ACCESS_KEY", description="Key of the secret access key in the Secret.")


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]


class PVCStorage(SpecModel):
    """The run's claim: an existing one (``claimName``), or one the operator creates (``<run>-data``)."""

    claim_name: K8sName | None = Field(
        None,
        description=(
            "An existing PersistentVolumeClaim holding data, checkpoints and merged models. Unset: the operator creates <run>-data from size, "
            "storageClassName and accessModes."
        ),
    )
    size: Quantity | None = Field(
        None,
        description=(
            "Size of the claim the operator creates. Default from the model size: weights, two SFT and two RL checkpoints with optimizer state, the "
            "merged models, plus headroom (32B: 2000Gi, 7B: 450Gi)."
        ),
    )
    storage_class_name: str | None = Field(
        None,
        pattern=K8S_NAME_PATTERN,
        max_length=253,
        description="Storage class of the claim the operator creates; default: the operator's (chart value defaults.storageClassName), else the cluster's default class.",
    )
    access_modes: list[AccessMode] | None = Field(
        None,
        min_length=1,
        max_length=2,
        description="Access modes of the claim the operator creates; default ReadWriteMany when hardware.nodes > 1 (every node mounts it), else ReadWriteOnce.",
    )
    mount_path: str = Field("/data", pattern=r"^/[^\s]*$", description="Where the claim is mounted in every stage's pods.")
    sub_path: str = Field("", pattern=r"^([^/\s][^\s]*)?$", description="Sub-directory of the claim used for this run.")


class S3Storage(SpecModel):
    uri: str = Field(..., pattern=S3_URI_PATTERN, description="s3://bucket/prefix where checkpoints and merged models are copied.")
    endpoint: str | None = Field(None, pattern=HTTP_URL_PATTERN, description="Endpoint of an S3-compatible store (MinIO, OBS, ...); AWS when unset.")
    region: str | None = Field(None, description="Region of the bucket.")
    secret_ref: SecretKeyRef | None = Field(None, description="Credentials; when unset the pods' own identity (IRSA, instance profile) is used.")


class StorageSpec(SpecModel):
    pvc: PVCStorage = Field(
        default_factory=PVCStorage,
        description="Shared filesystem through which stages pass data, checkpoints and models; the operator creates one unless claimName names an existing claim.",
    )
    retain: Literal["keep", "delete"] = Field(
        "keep",
        description=(
            "What happens to a claim the operator created when the run is deleted: keep (default; the checkpoints outlive the run) or delete (the claim "
            "is owned by the run and garbage-collected with it). Existing claims are never deleted."
        ),
    )
    s3: S3Storage | None = Field(None, description="Optional object store that receives a copy of checkpoints and final models.")


class EvalDataset(SpecModel):
    name: str = Field(
        ...,
        pattern=r"^[a-z0-9][a-z0-9_]*$",
        max_length=40,
        description="Data source name used in metric names (val-core/<name>/acc/mean@k), e.g. aime_2024.",
    )
    source: Source = Field(..., description="Hub id, s3:// URI or PVC path of the problems.")


def _default_eval_sets() -> list[EvalDataset]:
    return [
        EvalDataset(name="aime_2024", source="Maxwell-Jia/AIME_2024"),
        EvalDataset(name="aime_2025", source="yentinglin/aime_2025"),
    ]


MAX_MALFORMED_FRACTION_DEFAULT = 0.05


class DataSpec(SpecModel):
    sft: Source = Field("JoeYing/ReTool-SFT", description="Cold-start SFT trajectories (ReTool-SFT format or already multi-turn).")
    rl: Source = Field("BytedTsinghua-SIA/DAPO-Math-17k", description="RL prompts with ground truth (DAPO-Math-17k format); deduplicated.")
    eval: list[EvalDataset] = Field(
        default_factory=_default_eval_sets, min_length=1, max_length=16, description="Evaluation sets (AIME format), used for validation and the eval stage."
    )
    max_malformed_fraction: float = Field(
        MAX_MALFORMED_FRACTION_DEFAULT,
        ge=0,
        le=1,
        description="Largest share of malformed rows (bad JSON, text that is not UTF-8, missing fields) a source may have; above it the prepare stage fails and publishes nothing.",
    )
    max_rows: PositiveInt | None = Field(
        None,
        le=100_000_000,
        description="Keep at most this many rows of each data set (SFT, RL, every eval set) after deduplication, in source order. For smoke tests; unset keeps every row.",
    )


class SFTSpec(SpecModel):
    enabled: bool = Field(True, description="Run the cold-start SFT and merge stages; disable when the base model is already SFT'd.")
    epochs: PositiveInt = Field(6, le=1000, description="Passes over the SFT data.")
    batch_size: PositiveInt = Field(32, le=MAX_BATCH, description="Global batch size (trajectories per optimizer step).")
    micro_batch_size_per_device: PositiveInt = Field(4, le=MAX_BATCH, description="Trajectories per device per forward pass.")
    max_length: PositiveInt = Field(16384, le=MAX_TOKENS, description="Maximum tokens of one trajectory.")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Peak learning rate (cosine schedule).")
    weight_decay: float = Field(0.01, ge=0, lt=1, description="AdamW weight decay.")
    sequence_parallel: PositiveInt = Field(4, le=MAX_PARALLEL, description="Ulysses sequence-parallel size; must divide the devices.")
    save_freq: int | None = Field(
        None,
        ge=-1,
        le=MAX_STEPS,
        description=(
            "Save a checkpoint every N steps (a retry resumes from the latest); unset saves once per epoch (steps per epoch computed from "
            "the prepared data as verl does); -1 saves only at the end."
        ),
    )

    @field_validator("save_freq")
    @classmethod
    def _save_freq_not_zero(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("0 is not a save frequency: give N >= 1 steps, -1 for only at the end, or leave it unset for once per epoch")
        return value


class RewardWatchSpec(SpecModel):
    """A second verifier re-grading a sample of each training step's responses (see docs/recipe.md, "Training dynamics")."""

    share: float = Field(0.02, ge=0, le=1, description="Share of each step's responses re-graded by the second verifier (math-verify); 0 turns the watch off.")
    max_per_step: int = Field(64, ge=0, le=4096, description="At most this many responses re-graded per step, whatever the share.")
    benign_rate: float = Field(
        0.01,
        gt=0,
        lt=1,
        description="The second verifier's own disagreement rate with an honest reward on the run's data (the preflight measures it and "
        "recommends a value); RewardSuspect's false-alarm bound holds while the true rate is at most this, and far above it a real "
        "drift goes unseen. 0.01 is the 95% upper bound of 0 disagreements in 300 integer-answer rollouts.",
    )
    shift: float = Field(0.10, gt=0, lt=1, description="Rise of the disagreement rate above benignRate that the CUSUM alarm is tuned to catch (benignRate + shift < 1).")
    false_alarm: float = Field(
        0.01, gt=0, lt=1, description="Bound on the probability that RewardSuspect is ever raised over the run's rl.steps at the benign rate."
    )


class RLSpec(SpecModel):
    enabled: bool = Field(True, description="Run the multi-turn RL stage.")
    algorithm: Literal["grpo", "ppo"] = Field("grpo", description="Advantage estimator: grpo (no critic) or ppo (GAE with a critic).")
    steps: PositiveInt = Field(400, le=MAX_STEPS, description="Training steps (the paper reaches its AIME score at 400).")
    batch_size: PositiveInt = Field(512, le=MAX_BATCH, description="Prompts per training step (verl data.train_batch_size).")
    mini_batch_size: PositiveInt = Field(64, le=MAX_BATCH, description="Prompts per policy update (verl ppo_mini_batch_size); must divide batchSize.")
    rollout_n: PositiveInt = Field(16, le=1024, description="Responses sampled per prompt.")
    max_turns: PositiveInt = Field(8, le=256, description="Maximum assistant (and tool) turns per rollout.")
    max_prompt_length: PositiveInt = Field(2048, le=MAX_TOKENS, description="Prompt tokens; longer prompts are filtered out.")
    max_response_length: PositiveInt = Field(16384, le=MAX_TOKENS, description="Response tokens of the whole multi-turn trajectory.")
    learning_rate: float = Field(1e-6, gt=0, lt=1, description="Actor learning rate.")
    critic_learning_rate: float = Field(1e-5, gt=0, lt=1, description="Critic learning rate (ppo only).")
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="Lower PPO clip ratio.")
    clip_ratio_high: float = Field(0.28, gt=0, lt=10, description="Upper PPO clip ratio (DAPO clip-higher).")
    clip_ratio_c: float = Field(10.0, gt=1, le=1000, description="Dual-clip constant for negative advantages.")
    use_kl_loss: bool = Field(False, description="Add a KL loss against the reference policy.")
    kl_loss_coef: float = Field(0.0, ge=0, description="Weight of the KL loss.")
    use_kl_in_reward: bool = Field(False, description="Subtract a KL penalty from the reward.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty coefficient in the reward.")
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    temperature: float = Field(1.0, gt=0, le=10, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Rollout nucleus sampling.")
    tensor_parallel: PositiveInt = Field(4, le=MAX_PARALLEL, description="Rollout engine tensor-parallel size; must divide the devices of one node.")
    sequence_parallel: PositiveInt = Field(8, le=MAX_PARALLEL, description="Ulysses sequence-parallel size of training; must divide the devices.")
    offload: bool = Field(True, description="Offload parameters and optimizer state to CPU between phases.")
    dynamic_batch_size: bool = Field(True, description="Pack micro-batches by token count (verl use_dynamic_bsz).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of device memory the rollout engine may use.")
    rollout_engine: Literal["vllm", "sglang", "hf"] = Field(
        "vllm",
        description="Rollout engine; the public recipes use vllm. sglang is refused: no ReTool trainer image installs SGLang "
        "(trainer-cuda ships vLLM, trainer-ascend vllm-ascend). hf (Hugging Face transformers generation) is the rehearsal engine "
        "of hardware.accelerator cpu only: tiny models, no paged cache, never a real run.",
    )
    tool_response_max_chars: PositiveInt = Field(4096, le=1 << 20, description="Interpreter output kept in the context (head and tail around a marker).")
    save_freq: PositiveInt = Field(30, le=MAX_STEPS, description="Save a checkpoint every N steps (retries resume from the latest).")
    test_freq: PositiveInt = Field(5, le=MAX_STEPS, description="Validate on the eval sets every N steps.")
    val_before_train: bool = Field(True, description="Validate once before the first step (baseline).")
    log_val_generations: int = Field(20, ge=0, le=1000, description="Validation generations logged per test round.")
    tool_turn_shaping: bool = Field(
        False, description="Shape wrong answers by the number of tool turns (verl recipe option); off keeps the paper's +1/-1 reward."
    )
    rollout_traces: bool = Field(False, description="Record multi-turn rollout traces to MLflow (verl rollout tracing).")
    reward_watch: RewardWatchSpec = Field(default_factory=RewardWatchSpec, description="A second verifier watching the reward during training.")
    max_sandbox_failure_share: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="A trajectory whose interpreter call the sandbox did not run (overloaded, unreachable, sandbox error) is left out of "
        "its GRPO group and the loss; a step that would leave out more than this share of its trajectories fails instead of "
        "training on a broken batch (the stage's retry resumes from the last checkpoint).",
    )


class PreflightSpec(SpecModel):
    enabled: bool = Field(
        True,
        description=(
            "Run the preflight stage after prepare: the run's data, tokenizer, tool, reward and sandbox through verl's own runtime code "
            "on a CPU pod, so a broken run fails before any accelerator is requested."
        ),
    )


RENAMED_EVAL_KEYS = ("n", "false", False)
"""Former spellings of ``eval.samplesPerProblem``: ``n`` as written, and ``false``/``False`` as kubectl reads an
unquoted ``n:`` (YAML 1.1, sigs.k8s.io/yaml over go-yaml v2) and sends it to the API server."""


class EvalSpec(SpecModel):
    enabled: bool = Field(True, description="Run the final evaluation stage on data.eval.")
    samples_per_problem: PositiveInt = Field(
        30, le=1024, description="Samples per problem (mean@n, maj@n, pass@n use this n). Formerly `n`, a name YAML 1.1 reads as false."
    )
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature.")
    top_p: float = Field(0.6, gt=0, le=1, description="Nucleus sampling.")
    max_turns: PositiveInt | None = Field(None, le=256, description="Tool turns allowed; defaults to rl.maxTurns.")

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed_n(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key in RENAMED_EVAL_KEYS:
                if key in data:
                    spelled = "n (which kubectl's YAML 1.1 reads as the key false)" if key != "n" else "n"
                    raise ValueError(f"eval.{spelled} was renamed to eval.samplesPerProblem: write `samplesPerProblem: {data[key]}`")
        return data


def _default_sandbox_resources() -> ResourceRequirements:
    return ResourceRequirements(requests={"cpu": "8", "memory": "20Gi"}, limits={"cpu": "16", "memory": "20Gi"})


class SandboxSpec(SpecModel):
    max_concurrent: PositiveInt = Field(
        256, le=100000, description="Code executions the run may have in flight across all sandbox replicas (at most 1024 replicas' worth)."
    )
    per_replica_concurrency: PositiveInt = Field(
        16, le=SANDBOX_MAX_WORKERS, description="Concurrent executions of one sandbox replica (the server runs at most 512); replicas = ceil(maxConcurrent / this)."
    )
    timeout_seconds: float = Field(30, gt=0, le=3600, description="Wall-clock limit of one execution.")
    ready_timeout_seconds: int = Field(
        600,
        ge=5,
        le=86400,
        description="A sandbox replica not Ready this long after its pod was created (held by Kueue, unschedulable, an image it "
        "cannot pull, a crash) stops the wait: the preflight fails naming the cause, and the run turns Stalled.",
    )
    memory_limit_mb: int = Field(1024, alias="memoryLimitMB", ge=SANDBOX_MIN_MEMORY_MB, le=65536, description="Address-space limit of one execution, MiB.")
    image: Image | None = Field(None, description="Sandbox image override; defaults to the operator's sandbox image.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the sandbox pods require (they need CPU nodes, not the trainer nodes).")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations of the sandbox pods.")
    resources: ResourceRequirements = Field(
        default_factory=_default_sandbox_resources,
        description="Resources of one replica; limits.memory must hold perReplicaConcurrency executions of memoryLimitMB.",
    )
    isolation: Literal["auto", "strict"] = Field(
        "auto",
        description=(
            "auto: each replica isolates executions with the strongest layers its node allows (user namespaces, Landlock, seccomp)"
            " and reports them in /readyz and status.sandbox; strict: a replica whose executions are not kernel-isolated from each"
            " other and from the server stays not-ready and runs nothing."
        ),
    )
    runtime_class_name: K8sName | None = Field(
        None, description="RuntimeClass of the sandbox pods (e.g. gvisor, kata) where the cluster has one: the whole replica then runs under it."
    )


class MLflowSpec(SpecModel):
    tracking_uri: str | None = Field(
        None, pattern=HTTP_URL_PATTERN, description="External MLflow server; defaults to the operator's (chart) tracker, else a managed one."
    )
    experiment: str | None = Field(None, min_length=1, max_length=500, description="Experiment name; defaults to <namespace>/<name>.")
    register_model: bool = Field(True, description="Register the final model in the MLflow Model Registry with its eval scores.")
    registered_model_name: str | None = Field(None, min_length=1, max_length=256, description="Registry name; defaults to the run name.")


class CostSpec(SpecModel):
    """What a device-hour costs, for status.cost (docs/operations.md, "What a run costs")."""

    price_per_device_hour: float | None = Field(
        None, ge=0, le=1_000_000, description="Price of one device (GPU or NPU) for one hour; overrides the operator's default. Empty: hours only, no money."
    )
    currency: str | None = Field(None, pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the price, e.g. USD; the operator's default when empty.")


class TrackingSpec(SpecModel):
    mlflow: MLflowSpec = Field(default_factory=MLflowSpec, description="MLflow tracking of params, metrics, artifacts and models.")


class GangSpec(SpecModel):
    enabled: bool = Field(
        False,
        description=(
            "Gang-schedule every Ray stage: its head and all workers start together or not at all, through KubeRay's batch scheduler (Volcano or "
            "YuniKorn, chosen in the operator's configuration)."
        ),
    )
    queue: LabelValue | None = Field(None, min_length=1, description=(
        "Queue of the batch scheduler (Volcano queue, or YuniKorn queue such as root.ml); its default queue when unset."
    ))


class SchedulingSpec(SpecModel):
    queue_name: LabelValue | None = Field(
        None,
        min_length=1,
        description=(
            "Kueue LocalQueue of the run's namespace: every stage's Job and RayJob is created suspended with the kueue.x-k8s.io/queue-name label, and "
            "starts when Kueue admits it."
        ),
    )
    priority_class_name: K8sName | None = Field(
        None, description="PriorityClass of every stage pod (Kueue also takes the workload's priority from it unless workloadPriorityClassName is set)."
    )
    workload_priority_class_name: K8sName | None = Field(
        None, description="Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class): queue order and preemption without changing the pods' priority. Needs queueName."
    )
    gang: GangSpec = Field(default_factory=GangSpec, description="Gang scheduling of the Ray stages. Not combined with queueName (Kueue admits a stage's pods together already).")


class FailurePolicy(SpecModel):
    max_retries: int = Field(2, ge=0, le=9, description="Retries of a failed stage before the run fails; an RL retry resumes from its last checkpoint.")
    backoff_seconds: int = Field(60, ge=0, le=86400, description="Wait before the first retry; doubled for each further retry.")
    stage_deadline_seconds: int | None = Field(None, ge=60, le=INT32_MAX, description="Fail a stage attempt that runs longer than this (RayJob activeDeadlineSeconds).")
    cluster_grace_seconds: int = Field(
        0,
        ge=0,
        le=600,
        description=(
            "Keep a finished stage's Ray cluster (and its accelerators) this long after its job ends, for a look inside; "
            "0 releases the devices at once. The RayJob, the job submitter's log and the stage's MLflow run stay either way."
        ),
    )
    retry_on_same_cluster: bool = Field(
        True,
        description=(
            "Retry a Ray stage whose job failed (the driver exited with an error, Ray says FAILED) on the Ray cluster already up, "
            "when that cluster is healthy (every pod it started still running, none restarted, no node going) and the run "
            "is not queued by Kueue: no new pods, scheduling or image pulls. A second failure, or any failure of the cluster "
            "itself, gets a fresh cluster. false: every retry gets a fresh cluster."
        ),
    )


VerlLine = Literal["0.6.1", "0.9.1"]
"""The trainer lines (docs/verl-lines.md), named by their verl version: "0.6.1" (the public recipe's pin) and "0.9.1".
Never "0.6"/"0.9": YAML 1.1 (kubectl) reads those unquoted as numbers (issue 33's rule, tests/spec/test_crd.py)."""


class TrainerSpec(SpecModel):
    verl: VerlLine = Field(
        "0.6.1",
        description=(
            'Trainer line: "0.6.1" (verl 0.6.1, vLLM 0.11, transformers 4.x: the line that reproduces the published ReTool numbers) or '
            '"0.9.1" (verl 0.9.1, vLLM 0.24 on CUDA 13 / vLLM-Ascend 0.23 on CANN 9.1, transformers 5.x). The verl version, never a bare number (YAML reads 0.9 as one).'
        ),
    )

    @field_validator("verl", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f'must be "0.6.1" or "0.9.1" (the line\'s verl version): YAML read {value!r} as a number')
        return value


class RetoolRunSpec(SpecModel):
    recipe: Literal["tool-integrated", "text-only"] = Field(
        "tool-integrated",
        description=(
            "tool-integrated: ReTool (code interpreter in SFT data, RL rollouts and eval). text-only: the paper's text-based RL baseline, the same RL "
            "without the code interpreter (no tool in prompts or data, no sandbox; sft must be disabled)."
        ),
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="The model to train.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="Which verl line trains the run: its images, commands and adapters.")
    hardware: HardwareSpec = Field(default_factory=HardwareSpec, description="Trainer nodes and devices.")
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Where data, checkpoints and models live: a claim (created by the operator unless named), optionally mirrored to S3."
    )
    data: DataSpec = Field(default_factory=DataSpec, description="SFT, RL and evaluation data sources.")
    sft: SFTSpec = Field(default_factory=SFTSpec, description="Cold-start supervised fine-tuning.")
    preflight: PreflightSpec = Field(default_factory=PreflightSpec, description="Checks before the first accelerator stage.")
    rl: RLSpec = Field(default_factory=RLSpec, description="Multi-turn tool-integrated RL.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Final evaluation of the trained model.")
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec, description="The run's code sandbox.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Experiment tracking.")
    cost: CostSpec = Field(default_factory=CostSpec, description="The price of a device-hour, for the run's cost in status.cost.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="How the run joins the cluster's scheduling: a Kueue queue, priorities, gang scheduling.")
    pods: PodSettingsSpec = Field(
        default_factory=PodSettingsSpec, description="Per-run pod settings: service account, image pull secrets, environment, labels, annotations, extra volumes."
    )
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy, description="Retries and deadlines of stages.")
    suspend: bool = Field(False, description="Suspend the current stage and scale the sandbox to zero; false continues.")


class ObjectMeta(BaseModel):
    """The part of metadata the contract reads; the rest is the API server's business."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(..., min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RetoolRun(SpecModel):
    api_version: Literal["retool.dev/v1alpha1"] = Field(..., description="retool.dev/v1alpha1")
    kind: Literal["RetoolRun"] = Field(..., description="RetoolRun")
    metadata: ObjectMeta
    spec: RetoolRunSpec
    status: dict | None = Field(None, description="Written by the operator; ignored on input.")
