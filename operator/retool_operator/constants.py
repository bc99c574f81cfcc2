"""Label keys, annotation keys, condition types and reasons shared by builders, status and handlers."""

from __future__ import annotations

from retool.spec.model import API_GROUP, API_VERSION, KIND, PLURAL

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

PART_OF = "retool"
MANAGED_BY = "retool-operator"

# retool.dev/component values.
COMPONENT_SANDBOX = "sandbox"
COMPONENT_STAGE = "stage"
COMPONENT_SPEC = "spec"
COMPONENT_MLFLOW = "mlflow"

# kopf keeps its progress and diff-base here (annotations), never in the structural status.
KOPF_ANNOTATION_PREFIX = "kopf.retool.dev"

# The operator-managed MLflow tracker of a namespace (not owned by any run).
MLFLOW_NAME = "retool-mlflow"
MLFLOW_PORT = 5000

SPEC_KEY = "run.yaml"
SPEC_VOLUME = "run-spec"
DATA_VOLUME = "data"
SHM_VOLUME = "dshm"

# Condition types (metav1.Condition).
COND_READY = "Ready"  # the pipeline is progressing normally
COND_SUCCEEDED = "Succeeded"
COND_FAILED = "Failed"
COND_SUSPENDED = "Suspended"
COND_SANDBOX_READY = "SandboxReady"
COND_VALID = "SpecValid"

# Condition reasons (one CamelCase word each).
REASON_INVALID_SPEC = "InvalidSpec"
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
REASON_STAGE_STARTED = "StageStarted"
REASON_STAGE_SUCCEEDED = "StageSucceeded"
REASON_RETRY_STARTED = "RetryStarted"
REASON_MLFLOW_UNAVAILABLE = "MLflowUnavailable"
