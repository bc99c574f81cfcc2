"""Label keys, annotation keys, condition types and reasons shared by builders, status and handlers."""

from __future__ import annotations

from retool.spec.model import API_GROUP, API_VERSION, KIND, PLURAL
from retool.spec.names import DATA_VOLUME, SHM_VOLUME, SPEC_VOLUME  # noqa: F401  (the rules reserve these names)

GROUP = API_GROUP
VERSION = API_VERSION
RUN_KIND = KIND
RUN_PLURAL = PLURAL
RUN_API_VERSION = f"{API_GROUP}/{API_VERSION}"

# Labels on every child: the app.kubernetes.io set plus our own selectors.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = "retool.dev/run"
LABEL_ROLE = "retool.dev/component"
LABEL_STAGE = "retool.dev/stage"
LABEL_ATTEMPT = "retool.dev/attempt"
LABEL_POD_ROLE = "retool.dev/pod-role"  # "submitter" on the Ray job submitter's pods
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods (k8s >= 1.27)
RAY_CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay's label on a RayCluster's pods (``RayClusterLabelKey``, utils/constant.go v1.6.1) and the key of a
RayJob's clusterSelector (``RayJobClusterSelectorKey``)."""
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
"""KubeRay's label on a RayCluster's head and worker pods (``RayNodeTypeLabelKey``); the submitter pod has none."""

FOLLOWED_STATES = ("Running", "Queued", "Suspended")
"""Stage states whose child the operator reads each pass to learn what happened to it."""

PART_OF = "retool"
MANAGED_BY = "retool-operator"

# retool.dev/component values.
COMPONENT_SANDBOX = "sandbox"
COMPONENT_STAGE = "stage"
COMPONENT_SPEC = "spec"
COMPONENT_MLFLOW = "mlflow"
COMPONENT_STORAGE = "storage"

# On a claim the operator created: what happens to it when the run is deleted (spec.storage.retain).
ANNOTATION_RETAIN = "retool.dev/retain"

# On every stage RayJob: the operator's hold on it until the run's status has recorded its outcome.
# KubeRay with DELETE_RAYJOB_CR_AFTER_JOB_FINISHES deletes a finished RayJob itself; without the hold an
# operator that is down at that moment finds the child gone and cannot tell success from a deletion
# behind its back. Released as soon as the status has the outcome, or the run is gone (runner.py).
FINALIZER_OUTCOME = "retool.dev/stage-outcome"

# kopf keeps its progress and diff-base here (annotations), never in the structural status.
KOPF_ANNOTATION_PREFIX = "kopf.retool.dev"

# The operator-managed MLflow tracker of a namespace (not owned by any run).
MLFLOW_NAME = "retool-mlflow"
MLFLOW_PORT = 5000

SPEC_KEY = "run.yaml"

# Condition types (metav1.Condition). Ready, Reconciling and Stalled follow the kstatus
# convention that Flux, Argo CD and kpt read: Reconciling=True while the pipeline works towards
# its end, Stalled=True when it cannot get there (a stage failed, the spec is invalid, the API
# server refuses a child), Ready=True only once it has (every stage succeeded).
COND_READY = "Ready"
COND_RECONCILING = "Reconciling"
COND_STALLED = "Stalled"
COND_SUCCEEDED = "Succeeded"
COND_FAILED = "Failed"
COND_SUSPENDED = "Suspended"
COND_SANDBOX_READY = "SandboxReady"
COND_SANDBOX_ISOLATION = "SandboxIsolation"
COND_VALID = "SpecValid"
COND_STORAGE_READY = "StorageReady"
COND_PREFLIGHT_FINDINGS = "PreflightFindings"
"""True when the preflight reported warnings (reason PreflightWarnings) or failed (PreflightFailed): the message names the spec field."""
REASON_PREFLIGHT_WARNINGS = "PreflightWarnings"
REASON_PREFLIGHT_FAILED = "PreflightFailed"
COND_REWARD_SUSPECT = "RewardSuspect"
"""True while the rl stage's second verifier keeps disagreeing with the reward (spec.rl.rewardWatch)."""

# Condition reasons (one CamelCase word each).
REASON_INVALID_SPEC = "InvalidSpec"
REASON_IMMUTABLE_FIELD = "ImmutableFieldChanged"
REASON_VALID_SPEC = "SpecAccepted"
REASON_PENDING = "Pending"
REASON_STAGE_RUNNING = "StageRunning"
REASON_STAGE_RETRYING = "StageRetrying"
REASON_STAGE_FAILED = "StageFailed"
REASON_COMPLETED = "PipelineCompleted"
REASON_SUSPENDED = "SuspendedBySpec"
REASON_RESUMED = "Resumed"
REASON_NOT_SUSPENDED = "NotSuspended"
REASON_SANDBOX_READY = "ReplicasReady"
REASON_SANDBOX_NOT_READY = "ReplicasNotReady"
REASON_SANDBOX_SCALED_DOWN = "ScaledDown"
REASON_SANDBOX_PODS_REFUSED = "PodsRefused"
"""The Deployment's ReplicaFailure condition: its ReplicaSet cannot create pods (Pod Security admission,
quota, a missing RuntimeClass, ...)."""
REASON_ISOLATION_STRONG = "StrongIsolation"
REASON_ISOLATION_WEAK = "WeakIsolation"
REASON_ISOLATION_ROOT_ON_NODE = "RootOnNode"
REASON_ISOLATION_NOT_OBSERVED = "NotObserved"
REASON_ISOLATION_UNREADABLE = "ReadyzUnreadable"
REASON_STAGE_CREATED = "StageCreated"  # the stage's child (Job, RayJob) was created; its pods may still wait
REASON_STAGE_STARTED = "StageStarted"  # a pod of the stage's current attempt is running
REASON_STAGE_SUCCEEDED = "StageSucceeded"
REASON_RETRY_STARTED = "RetryStarted"
REASON_CLUSTER_NOT_REUSED = "ClusterNotReused"  # the Ray cluster kept for a retry could not run it: a fresh one
REASON_MLFLOW_UNAVAILABLE = "MLflowUnavailable"
REASON_WAITING_FOR_PODS = "WaitingForPods"
REASON_CHILD_REFUSED = "ChildRefused"
REASON_SPEC_WARNING = "SpecWarning"
REASON_REWARD_DISAGREES = "VerifierDisagrees"
REASON_REWARD_AGREES = "VerifierAgrees"
REASON_FINISHED = "Finished"
REASON_SAVE_REQUESTED = "SaveRequested"  # a node under the running rl attempt is going: its trainer is asked to save
REASON_SAVED_ON_NOTICE = "SavedOnNotice"  # the trainer saved a checkpoint on that request
REASON_RESUMED_FROM_STEP = "ResumedFromStep"  # an rl attempt resumed from its last checkpoint
REASON_RUN_COST = "RunCost"  # a finished run's device-hours (and money, when priced), once
REASON_NOT_STALLED = "Progressing"
REASON_QUEUED = "Queued"
REASON_STAGE_ADMITTED = "StageAdmitted"
REASON_STAGE_PREEMPTED = "StagePreempted"
REASON_STATUS_CHECK_TIMEOUT = "RayJobStatusCheckTimeout"
"""KubeRay (>= 1.7) lost track of a stage's Ray job (JobStatusCheckTimeoutExceeded): retried, no retry used."""
REASON_SANDBOX_NOT_USED = "NotUsed"
REASON_CLAIM_READY = "ClaimReady"
REASON_CLAIM_PENDING = "ClaimPending"
REASON_CLAIM_NOT_FOUND = "ClaimNotFound"
REASON_CLAIM_NOT_SHARED = "ClaimNotShared"
REASON_SCHEDULING_CHANGED = "SchedulingChanged"

# Kueue: the Workload it makes for each queued Job/RayJob (found by the job's uid), and our mark on a
# Workload the operator deactivated for spec.suspend (only those are reactivated on resume).
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ANNOTATION_DEACTIVATED = "retool.dev/deactivated-by"
