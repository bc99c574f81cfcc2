"""The RetoolRun resource: the one definition every component reads.

The CRD's schema is generated from these models (``make crd``), the admission webhook and the
operator parse with them, and ``retool validate`` reports their errors, so a field exists once
with its description, default and bounds. Defaults are the public ReTool recipe for
Qwen2.5-32B-Instruct on one 8xH200 node (verl ``recipe/retool``, run_qwen2-32b_sft.sh and
run_qwen2-32b_dapo.sh). Rules that span several fields live in ``rules.py``.

Python attributes are snake_case; the YAML and the CRD use the camelCase aliases.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

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
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
IMAGE_PATTERN = r"^[^\s]+$"

Source = Annotated[str, StringConstraints(pattern=SOURCE_PATTERN, max_length=1024)]
K8sName = Annotated[str, StringConstraints(pattern=K8S_NAME_PATTERN, min_length=1, max_length=253)]
Image = Annotated[str, StringConstraints(pattern=IMAGE_PATTERN, min_length=1, max_length=512)]
PositiveInt = Annotated[int, Field(ge=1)]


class SpecModel(BaseModel):
    """Base of every spec object: camelCase in YAML, unknown fields rejected (typos fail loudly)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=False,
        validate_default=True,
    )


class ModelSpec(SpecModel):
    base: Source = Field(
        "Qwen/Qwen2.5-32B-Instruct",
        description="Base model to train: a Hugging Face id (org/name), an s3:// URI, or an absolute path on the run's PVC.",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) of a Hugging Face id.")
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
    toleration_seconds: int | None = Field(None, ge=0, description="How long a NoExecute taint is tolerated.")


class ResourceRequirements(SpecModel):
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Minimum resources (cpu, memory, ...), Kubernetes quantities.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Maximum resources (cpu, memory, ...), Kubernetes quantities.")


class HardwareSpec(SpecModel):
    accelerator: Literal["nvidia", "ascend"] = Field(
        "nvidia", description="Device family of the trainer nodes: nvidia (CUDA GPUs) or ascend (Huawei Ascend NPUs)."
    )
    product: str | None = Field(
        None,
        max_length=63,
        description="Device product to schedule on, e.g. H200 or NVIDIA-H200 (nvidia: nodeSelector nvidia.com/gpu.product). Optional.",
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


class PVCStorage(SpecModel):
    claim_name: K8sName = Field(..., description="PersistentVolumeClaim holding data, checkpoints and merged models.")
    mount_path: str = Field("/data", pattern=r"^/[^\s]*$", description="Where the claim is mounted in every stage's pods.")
    sub_path: str = Field("", pattern=r"^([^/\s][^\s]*)?$", description="Sub-directory of the claim used for this run.")


class S3Storage(SpecModel):
    uri: str = Field(..., pattern=S3_URI_PATTERN, description="s3://bucket/prefix where checkpoints and merged models are copied.")
    endpoint: str | None = Field(None, pattern=HTTP_URL_PATTERN, description="Endpoint of an S3-compatible store (MinIO, OBS, ...); AWS when unset.")
    region: str | None = Field(None, description="Region of the bucket.")
    secret_ref: SecretKeyRef | None = Field(None, description="Credentials; when unset the pods' own identity (IRSA, instance profile) is used.")


class StorageSpec(SpecModel):
    pvc: PVCStorage | None = Field(
        None, description="Required. Shared filesystem through which stages pass data, checkpoints and models (ReadWriteMany when nodes > 1)."
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


class DataSpec(SpecModel):
    sft: Source = Field("JoeYing/ReTool-SFT", description="Cold-start SFT trajectories (ReTool-SFT format or already multi-turn).")
    rl: Source = Field("BytedTsinghua-SIA/DAPO-Math-17k", description="RL prompts with ground truth (DAPO-Math-17k format); deduplicated.")
    eval: list[EvalDataset] = Field(
        default_factory=_default_eval_sets, min_length=1, max_length=16, description="Evaluation sets (AIME format), used for validation and the eval stage."
    )


class SFTSpec(SpecModel):
    enabled: bool = Field(True, description="Run the cold-start SFT and merge stages; disable when the base model is already SFT'd.")
    epochs: PositiveInt = Field(6, le=1000, description="Passes over the SFT data.")
    batch_size: PositiveInt = Field(32, description="Global batch size (trajectories per optimizer step).")
    micro_batch_size_per_device: PositiveInt = Field(4, description="Trajectories per device per forward pass.")
    max_length: PositiveInt = Field(16384, le=1048576, description="Maximum tokens of one trajectory.")
    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Peak learning rate (cosine schedule).")
    weight_decay: float = Field(0.01, ge=0, lt=1, description="AdamW weight decay.")
    sequence_parallel: PositiveInt = Field(4, description="Ulysses sequence-parallel size; must divide the devices.")
    save_freq: int = Field(-1, ge=-1, description="Save a checkpoint every N steps; -1 saves only at the end.")


class RLSpec(SpecModel):
    enabled: bool = Field(True, description="Run the multi-turn RL stage.")
    algorithm: Literal["grpo", "ppo"] = Field("grpo", description="Advantage estimator: grpo (no critic) or ppo (GAE with a critic).")
    steps: PositiveInt = Field(400, description="Training steps (the paper reaches its AIME score at 400).")
    batch_size: PositiveInt = Field(512, description="Prompts per training step (verl data.train_batch_size).")
    mini_batch_size: PositiveInt = Field(64, description="Prompts per policy update (verl ppo_mini_batch_size); must divide batchSize.")
    rollout_n: PositiveInt = Field(16, le=1024, description="Responses sampled per prompt.")
    max_turns: PositiveInt = Field(8, le=256, description="Maximum assistant (and tool) turns per rollout.")
    max_prompt_length: PositiveInt = Field(2048, description="Prompt tokens; longer prompts are filtered out.")
    max_response_length: PositiveInt = Field(16384, description="Response tokens of the whole multi-turn trajectory.")
    learning_rate: float = Field(1e-6, gt=0, lt=1, description="Actor learning rate.")
    critic_learning_rate: float = Field(1e-5, gt=0, lt=1, description="Critic learning rate (ppo only).")
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="Lower PPO clip ratio.")
    clip_ratio_high: float = Field(0.28, gt=0, lt=10, description="Upper PPO clip ratio (DAPO clip-higher).")
    clip_ratio_c: float = Field(10.0, gt=1, description="Dual-clip constant for negative advantages.")
    use_kl_loss: bool = Field(False, description="Add a KL loss against the reference policy.")
    kl_loss_coef: float = Field(0.0, ge=0, description="Weight of the KL loss.")
    use_kl_in_reward: bool = Field(False, description="Subtract a KL penalty from the reward.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty coefficient in the reward.")
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    temperature: float = Field(1.0, gt=0, le=10, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Rollout nucleus sampling.")
    tensor_parallel: PositiveInt = Field(4, description="Rollout engine tensor-parallel size; must divide the devices of one node.")
    sequence_parallel: PositiveInt = Field(8, description="Ulysses sequence-parallel size of training; must divide the devices.")
    offload: bool = Field(True, description="Offload parameters and optimizer state to CPU between phases.")
    dynamic_batch_size: bool = Field(True, description="Pack micro-batches by token count (verl use_dynamic_bsz).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of device memory the rollout engine may use.")
    rollout_engine: Literal["vllm", "sglang"] = Field("vllm", description="Rollout engine; the public recipes use vllm.")
    tool_response_max_chars: PositiveInt = Field(4096, description="Interpreter output kept in the context (head and tail around a marker).")
    save_freq: PositiveInt = Field(30, description="Save a checkpoint every N steps (retries resume from the latest).")
    test_freq: PositiveInt = Field(5, description="Validate on the eval sets every N steps.")
    val_before_train: bool = Field(True, description="Validate once before the first step (baseline).")
    log_val_generations: int = Field(20, ge=0, le=1000, description="Validation generations logged per test round.")
    tool_turn_shaping: bool = Field(
        False, description="Shape wrong answers by the number of tool turns (verl recipe option); off keeps the paper's +1/-1 reward."
    )
    rollout_traces: bool = Field(False, description="Record multi-turn rollout traces to MLflow (verl rollout tracing).")


class EvalSpec(SpecModel):
    enabled: bool = Field(True, description="Run the final evaluation stage on data.eval.")
    n: PositiveInt = Field(30, le=1024, description="Samples per problem (mean@n, maj@n, pass@n).")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature.")
    top_p: float = Field(0.6, gt=0, le=1, description="Nucleus sampling.")
    max_turns: PositiveInt | None = Field(None, le=256, description="Tool turns allowed; defaults to rl.maxTurns.")


def _default_sandbox_resources() -> ResourceRequirements:
    return ResourceRequirements(requests={"cpu": "8", "memory": "20Gi"}, limits={"cpu": "16", "memory": "20Gi"})


class SandboxSpec(SpecModel):
    max_concurrent: PositiveInt = Field(256, le=100000, description="Code executions the run may have in flight across all sandbox replicas.")
    per_replica_concurrency: PositiveInt = Field(16, le=1024, description="Concurrent executions of one sandbox replica; replicas = ceil(maxConcurrent / this).")
    timeout_seconds: float = Field(30, gt=0, le=3600, description="Wall-clock limit of one execution.")
    memory_limit_mb: PositiveInt = Field(1024, alias="memoryLimitMB", le=65536, description="Address-space limit of one execution, MiB.")
    image: Image | None = Field(None, description="Sandbox image override; defaults to the operator's sandbox image.")
    resources: ResourceRequirements = Field(
        default_factory=_default_sandbox_resources,
        description="Resources of one replica; limits.memory must hold perReplicaConcurrency executions of memoryLimitMB.",
    )


class MLflowSpec(SpecModel):
    tracking_uri: str | None = Field(
        None, pattern=HTTP_URL_PATTERN, description="External MLflow server; defaults to the operator's (chart) tracker, else a managed one."
    )
    experiment: str | None = Field(None, min_length=1, max_length=500, description="Experiment name; defaults to <namespace>/<name>.")
    register_model: bool = Field(True, description="Register the final model in the MLflow Model Registry with its eval scores.")
    registered_model_name: str | None = Field(None, min_length=1, max_length=256, description="Registry name; defaults to the run name.")


class TrackingSpec(SpecModel):
    mlflow: MLflowSpec = Field(default_factory=MLflowSpec, description="MLflow tracking of params, metrics, artifacts and models.")


class FailurePolicy(SpecModel):
    max_retries: int = Field(2, ge=0, le=9, description="Retries of a failed stage before the run fails; an RL retry resumes from its last checkpoint.")
    backoff_seconds: int = Field(60, ge=0, le=86400, description="Wait before the first retry; doubled for each further retry.")
    stage_deadline_seconds: int | None = Field(None, ge=60, description="Fail a stage attempt that runs longer than this (RayJob activeDeadlineSeconds).")
    ttl_seconds_after_finished: int = Field(3600, ge=0, description="Keep a finished stage's Ray cluster/Job this long for inspection.")


class RetoolRunSpec(SpecModel):
    model: ModelSpec = Field(default_factory=ModelSpec, description="The model to train.")
    hardware: HardwareSpec = Field(default_factory=HardwareSpec, description="Trainer nodes and devices.")
    storage: StorageSpec = Field(..., description="Where data, checkpoints and models live: a PVC, optionally mirrored to S3.")
    data: DataSpec = Field(default_factory=DataSpec, description="SFT, RL and evaluation data sources.")
    sft: SFTSpec = Field(default_factory=SFTSpec, description="Cold-start supervised fine-tuning.")
    rl: RLSpec = Field(default_factory=RLSpec, description="Multi-turn tool-integrated RL.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Final evaluation of the trained model.")
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec, description="The run's code sandbox.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Experiment tracking.")
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
