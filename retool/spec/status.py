"""The RetoolRun status: what the operator reports and the printer columns show.

Typed here (not free-form) so the CRD's status schema is structural and ``kubectl explain
retoolrun.status`` documents it; the operator builds its status patches with these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from retool.spec.model import SpecModel

Phase = Literal["Pending", "Preparing", "Preflight", "SFT", "Merging", "RL", "Evaluating", "Succeeded", "Failed", "Suspended"]
StageState = Literal["Pending", "Queued", "Running", "Retrying", "Succeeded", "Failed", "Skipped", "Suspended"]

PHASE_OF_STAGE: dict[str, str] = {
    "prepare": "Preparing",
    "preflight": "Preflight",
    "sft": "SFT",
    "merge": "Merging",
    "rl": "RL",
    "eval": "Evaluating",
}


class SaveRequest(SpecModel):
    """The operator's request to the rl stage's trainer to save at its next step boundary (docs/operations.md, "Save on notice")."""

    attempt: int = Field(..., ge=1, description="Attempt the request was made to.")
    reason: str = Field(..., description="Why: which node is going, and the sign (a cordon, a taint, a disruption, Kueue's eviction).")
    requested_time: str = Field(..., description="When the operator saw the sign (RFC 3339).")
    delivered: bool = Field(False, description="The request reached the attempt's MLflow run, where the trainer reads it once per step.")
    saved_step: int | None = Field(None, ge=0, description="The global step of the checkpoint the trainer saved on the request.")


class ResumePoint(SpecModel):
    attempt: int = Field(..., ge=1, description="The attempt that resumed.")
    step: int = Field(..., ge=0, description="The global step it continued after (its trainer's last checkpoint; 0: it started afresh).")


class KeptCluster(SpecModel):
    name: str = Field(..., description="The RayCluster the operator keeps up for the stage.")
    owner: str = Field(..., description="The RayJob that created it (KubeRay deletes the cluster with it).")
    attempt: int = Field(..., ge=1, description="The attempt that runs (or will run) on it, with a RayJob whose clusterSelector names it.")
    kept_time: str = Field(..., description="When the failed attempt's cluster was kept (RFC 3339).")
    released: str | None = Field(None, description="Why the operator gave it up before or after its attempt (it deletes it then).")


class StageStatus(SpecModel):
    name: Literal["prepare", "preflight", "sft", "merge", "rl", "eval"] = Field(..., description="Stage name.")
    state: StageState = Field(
        "Pending", description="Pending, Queued (waiting for admission by the run's Kueue queue), Running, Retrying, Succeeded, Failed, Skipped or Suspended."
    )
    job: str | None = Field(None, description="Name of the Job or RayJob of the current attempt.")
    attempt: int = Field(0, ge=0, description="Current attempt, from 1; 0 before the stage starts.")
    start_time: str | None = Field(None, description="When the first attempt started (RFC 3339).")
    running_time: str | None = Field(
        None, description="When a pod of the current attempt was first seen running (RFC 3339); the StageStarted Event is posted then."
    )
    completion_time: str | None = Field(None, description="When the stage finished (RFC 3339).")
    message: str | None = Field(None, description="Why the stage is in its state.")
    checkpoint: str | None = Field(None, description="Latest checkpoint or output path of the stage.")
    next_attempt_time: str | None = Field(None, description="While Retrying: when the next attempt starts (RFC 3339), after the failure policy's backoff.")
    preemptions: int | None = Field(None, ge=0, description="Times the queue preempted the stage (re-suspended it); preemptions are waits, never failed attempts.")
    preempted_attempts: int | None = Field(
        None, ge=0, description="Attempts that a preemption ended (a batch Job cannot resume) and a new attempt replaced; they use no retry."
    )
    ray_cluster: KeptCluster | None = Field(
        None,
        description=(
            "A Ray cluster kept after its attempt's job failed, for the next attempt (failurePolicy.retryOnSameCluster); "
            "the operator, not KubeRay, deletes it once that attempt ends."
        ),
    )
    save_request: SaveRequest | None = Field(None, description="rl: the last request to save on notice, and what came of it.")
    resumed_from: ResumePoint | None = Field(None, description="rl: the step the current attempt's trainer resumed after, once it says.")
    status_check_timeouts: int | None = Field(
        None,
        ge=0,
        description=(
            "Attempts whose RayJob KubeRay (>= 1.7) failed with JobStatusCheckTimeoutExceeded (the Ray dashboard could not be polled "
            "for its timeout, 300 s by default): retried on a fresh Ray cluster, resuming from the last checkpoint, without using a "
            "retry; past 3 in one stage they count as failed attempts."
        ),
    )


class Condition(SpecModel):
    type: str = Field(..., description="Condition type, e.g. Ready, Reconciling, Stalled, Succeeded, Failed, Suspended, SpecValid, SandboxReady, SandboxIsolation.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(..., description="One-word CamelCase reason.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field(..., description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="metadata.generation the condition was computed from.")


class SandboxIsolationStatus(SpecModel):
    """What the sandbox replicas report in /readyz ``isolation`` (read by the operator), summed up."""

    strong: bool = Field(False, description="Every observed replica's isolation is strong: each way out of an execution is closed by a kernel-enforced layer.")
    mode: str | None = Field(None, description="Namespace mode of the replicas: root-namespaces, user-namespaces or none (mixed when they differ).")
    layers: list[str] = Field(
        default_factory=list, description="Isolation layers in force on every observed replica (e.g. uid-per-execution, pid-namespace, landlock-filesystem, seccomp)."
    )
    runtime_class: str | None = Field(None, description="RuntimeClass the replicas report running under (spec.sandbox.runtimeClassName).")
    replicas: int = Field(0, ge=0, description="Replicas whose /readyz the operator read.")
    weak_replicas: list[str] = Field(default_factory=list, description="Pods whose isolation is not strong (at most 10).")
    root_on_node: list[str] = Field(
        default_factory=list, description="Pods whose server runs as root of the node's user namespace: their hostUsers: false did not take effect (at most 10)."
    )
    problems: list[str] = Field(default_factory=list, description="What the replicas say is missing, each once (at most 10).")


class SandboxStatus(SpecModel):
    replicas: int = Field(0, ge=0, description="Desired sandbox replicas.")
    ready_replicas: int = Field(0, ge=0, description="Ready sandbox replicas.")
    url: str | None = Field(None, description="In-cluster URL of the sandbox Service.")
    isolation: SandboxIsolationStatus | None = Field(
        None, description="Isolation of the replicas, from their /readyz (the last one observed while the sandbox is scaled to zero)."
    )


class MLflowStatus(SpecModel):
    url: str | None = Field(None, description="MLflow tracking URL of the run.")
    experiment_id: str | None = Field(None, description="MLflow experiment id.")
    run_id: str | None = Field(None, description="Parent MLflow run id; stages log child runs under it.")


class StorageStatus(SpecModel):
    claim_name: str = Field(..., description="The PersistentVolumeClaim every stage mounts.")
    managed: bool = Field(False, description="Created by the operator (<run>-data); false for an existing claim named in the spec.")
    retain: Literal["keep", "delete"] | None = Field(None, description="For a created claim: kept when the run is deleted, or deleted with it.")
    size: str | None = Field(None, description="Requested size (status.capacity once bound).")
    storage_class_name: str | None = Field(None, description="Storage class of the claim.")
    access_modes: list[str] = Field(default_factory=list, description="Access modes of the claim (status.accessModes once bound).")
    phase: str | None = Field(None, description="Pending, Bound or Lost; empty when the claim does not exist yet.")


class PodDeviceUse(SpecModel):
    """One stage pod that holds devices, while the API server still has it (``retool_operator.cost``)."""

    name: str = Field(..., description="Pod name.")
    uid: str = Field(..., description="Pod uid (a pod of the same name made later is another pod).")
    stage: str = Field(..., description="Stage the pod belongs to.")
    attempt: int = Field(..., ge=1, description="Attempt of the stage the pod belongs to.")
    devices: int = Field(..., ge=1, description="Devices the pod requests (the hardware profile's device resource, all containers).")
    scheduled_time: str = Field(..., description="When the scheduler bound the pod to a node (its PodScheduled condition, RFC 3339).")
    end_time: str | None = Field(None, description="When its last container terminated (RFC 3339); empty while it runs.")
    since_time: str | None = Field(
        None, description="When this attempt took the pod over from an earlier one (a retry on the same Ray cluster, RFC 3339); it counts from then."
    )


class AttemptCost(SpecModel):
    stage: str = Field(..., description="Stage name.")
    attempt: int = Field(..., ge=1, description="Attempt, from 1.")
    device_hours: float = Field(0.0, ge=0, description="Device-hours of the attempt's pods, scheduled to terminated (running pods up to observedAt).")
    settled_device_hours: float = Field(0.0, ge=0, description="The part of deviceHours from pods the API server no longer has (final).")
    lost: bool = Field(False, description="The attempt did not give the stage its result: it failed, was preempted, or a later attempt replaced it.")


class CostStatus(SpecModel):
    device_hours: float = Field(0.0, ge=0, description="Device-hours of every stage and attempt, lost ones included (as of observedAt while pods run).")
    lost_device_hours: float = Field(0.0, ge=0, description="The part of deviceHours spent on lost attempts.")
    device_hours_per_point: float | None = Field(
        None, ge=0, description="deviceHours per point of the headline eval score (score x 100), once eval has a score above 0."
    )
    price_per_device_hour: float | None = Field(None, ge=0, description="The price used (spec.cost, else the operator's default); empty: hours only.")
    currency: str | None = Field(None, description="Currency of the price.")
    amount: float | None = Field(None, ge=0, description="deviceHours x pricePerDeviceHour, when a price is configured.")
    stages: dict[str, float] = Field(default_factory=dict, description="Device-hours per stage, all attempts.")
    attempts: list[AttemptCost] = Field(default_factory=list, description="Device-hours per stage attempt, lost attempts included.")
    pods: list[PodDeviceUse] = Field(
        default_factory=list, description="The ledger: stage pods holding devices that the API server still has; a pod that is gone is settled into its attempt."
    )


class RetoolRunStatus(SpecModel):
    phase: Phase = Field("Pending", description="Where the pipeline is.")
    stage: str | None = Field(None, description="Current (or last) stage.")
    progress: str | None = Field(None, description="Human-readable progress, e.g. 'rl 120/400'.")
    score: float | None = Field(None, description="Headline eval score: mean@n of the first eval set.")
    message: str | None = Field(None, description="Latest notable event.")
    stages: list[StageStatus] = Field(
        default_factory=list,
        description="One entry per stage of the pipeline.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Standard metav1.Condition list, one per type (a list-map keyed by type, as server-side apply and kstatus expect): "
            "Ready (True once every stage succeeded), Reconciling (True while the pipeline works), Stalled (True when it cannot go on: "
            "a failed stage, an invalid spec, a child the API server refuses), Succeeded, Failed, Suspended, SpecValid, SandboxReady, "
            "SandboxIsolation (True when every sandbox replica reports strong isolation), StorageReady."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    sandbox: SandboxStatus | None = Field(None, description="The run's code sandbox.")
    mlflow: MLflowStatus | None = Field(None, description="Where the run is tracked.")
    storage: StorageStatus | None = Field(None, description="The run's claim.")
    results: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Eval results per data source and metric, e.g. aime_2024: {mean@30: 0.67}."
    )
    cost: CostStatus | None = Field(None, description="What the run has used: device-hours per stage and attempt, from its pods' scheduled-to-terminated times.")
    observed_generation: int | None = Field(None, description="metadata.generation the status reflects.")
    observed_at: str | None = Field(
        None,
        description="When the operator last looked at the run and its children (RFC 3339). Refreshed at least every 5 minutes "
        "while the run is not finished and an operator watches it: an older value means the status is stale (no operator running).",
    )
