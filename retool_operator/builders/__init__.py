"""Pure builders: a RetoolRun (plus everything else they need, as arguments) -> child manifests.

One module per child kind, and one pod path:

- :mod:`.meta`: names, labels, owner references, the resolved tracking target;
- :mod:`.pods`: ``pod_template``, the only function that assembles a pod template, and the
  per-role ``PodSettings`` (stage pods, sandbox, MLflow) it applies: a pod setting added there
  reaches every pod the operator creates;
- :mod:`.run_spec`: the ``<run>-spec`` ConfigMap every stage pod mounts;
- :mod:`.storage`: the run's claim (an existing one or ``<run>-data``, sized from the model) and how
  stage pods mount it;
- :mod:`.scheduling`: the labels (and initial suspension) that hand a child to Kueue or to
  KubeRay's batch scheduler;
- :mod:`.sandbox`: the sandbox Deployment, Service, NetworkPolicy and PDB;
- :mod:`.sandbox_security`: the sandbox pod's privileges (non-root, or root of its own user namespace);
- :mod:`.stages`: the Job or RayJob of one attempt of a stage;
- :mod:`.mlflow`: the operator-managed MLflow tracker of a namespace.

No environment reads and no API calls here: handlers resolve the config, the tracking URI and the
parent MLflow run first and pass them in, so ``retool render`` and the tests see exactly what the
operator applies. Owner references are added by ``owned_by`` (handlers) because they need the
run's uid, which a file on disk does not have.
"""

from retool_operator.builders.meta import Tracking, experiment_name, labels, owned_by, run_namespace, selector_labels
from retool_operator.builders.mlflow import build_mlflow, managed_mlflow_uri
from retool_operator.builders.pods import PodSettings, RunPodSettings, pod_template, run_pod_settings
from retool_operator.builders.run_spec import build_spec_configmap, run_document, spec_configmap_name
from retool_operator.builders.sandbox import (
    build_sandbox,
    build_sandbox_deployment,
    build_sandbox_network_policy,
    build_sandbox_pdb,
    build_sandbox_service,
    desired_sandbox_replicas,
    uses_sandbox,
)
from retool_operator.builders.sandbox_security import SANDBOX_RUN_AS_USER, SandboxSecurity, sandbox_security
from retool_operator.builders.scheduling import queued, scheduling_labels, scheduling_problems
from retool_operator.builders.stages import JOB_RESOURCES, build_stage_child, build_stage_job, build_stage_rayjob, stage_command
from retool_operator.builders.storage import Claim, build_claim, claim_name, default_claim_size, run_claim

__all__ = [
    "JOB_RESOURCES",
    "SANDBOX_RUN_AS_USER",
    "Claim",
    "PodSettings",
    "RunPodSettings",
    "SandboxSecurity",
    "Tracking",
    "build_claim",
    "build_mlflow",
    "build_sandbox",
    "build_sandbox_deployment",
    "build_sandbox_network_policy",
    "build_sandbox_pdb",
    "build_sandbox_service",
    "build_spec_configmap",
    "build_stage_child",
    "build_stage_job",
    "build_stage_rayjob",
    "claim_name",
    "default_claim_size",
    "desired_sandbox_replicas",
    "experiment_name",
    "labels",
    "managed_mlflow_uri",
    "owned_by",
    "pod_template",
    "queued",
    "run_claim",
    "run_document",
    "run_namespace",
    "run_pod_settings",
    "sandbox_security",
    "scheduling_labels",
    "scheduling_problems",
    "selector_labels",
    "spec_configmap_name",
    "stage_command",
    "uses_sandbox",
]
