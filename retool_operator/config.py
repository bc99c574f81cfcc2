"""Operator settings, read once from ``RETOOL_OPERATOR_*`` environment variables.

The Helm chart sets these from its values; builders never read the environment themselves, they
receive an ``OperatorConfig`` argument, so a test (or ``retool render``) can pass any config.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from retool.spec.model import MAX_SANDBOX_REPLICAS
from retool.spec.operator_rules import DEFAULT_SANDBOX_MAX_REPLICAS

DEFAULT_TRAINER_IMAGE_NVIDIA = "retool/trainer-cuda:0.1.0"
DEFAULT_TRAINER_IMAGE_ASCEND = "retool/trainer-ascend:0.1.0"
DEFAULT_TRAINER_IMAGE_NVIDIA_VERL09 = "retool/trainer-cuda-verl09:0.1.0"
DEFAULT_TRAINER_IMAGE_ASCEND_VERL09 = "retool/trainer-ascend-verl09:0.1.0"
DEFAULT_SANDBOX_IMAGE = "retool/sandbox:0.1.0"
DEFAULT_MLFLOW_IMAGE = "retool/mlflow:3.17.2"


class OperatorConfig(BaseSettings):
    """What the operator needs that is not in a RetoolRun: images, device names, scope, webhook."""

    model_config = SettingsConfigDict(env_prefix="RETOOL_OPERATOR_", extra="ignore", frozen=True)

    trainer_image_nvidia: str = Field(DEFAULT_TRAINER_IMAGE_NVIDIA, description="Trainer image for NVIDIA (CUDA) nodes.")
    trainer_image_ascend: str = Field(DEFAULT_TRAINER_IMAGE_ASCEND, description="Trainer image for Ascend (CANN, torch_npu) nodes.")
    trainer_image_nvidia_verl09: str = Field(DEFAULT_TRAINER_IMAGE_NVIDIA_VERL09, description='Trainer image for NVIDIA nodes of runs of spec.trainer.verl "0.9.1".')
    trainer_image_ascend_verl09: str = Field(DEFAULT_TRAINER_IMAGE_ASCEND_VERL09, description='Trainer image for Ascend nodes of runs of spec.trainer.verl "0.9.1".')
    sandbox_image: str = Field(DEFAULT_SANDBOX_IMAGE, description="Default code sandbox image.")
    mlflow_image: str = Field(DEFAULT_MLFLOW_IMAGE, description="Image of the operator-managed MLflow tracker.")
    mlflow_tracking_uri: str = Field("", description="Default MLflow tracking URI (the chart's tracker); empty = an operator-managed tracker per namespace.")
    nvidia_resource_name: str = Field("nvidia.com/gpu", description="Extended resource of NVIDIA GPUs.")
    ascend_resource_name: str = Field("huawei.com/Ascend910", description="Extended resource of Ascend NPUs.")
    ascend_node_selector: str = Field("accelerator=huawei-Ascend910", description="key=value[,key=value] node labels of Ascend nodes.")
    metrics_scraper_namespaces: str = Field(
        "", description="key=value[,key=value] labels of the namespace whose pods scrape sandbox /metrics (e.g. kubernetes.io/metadata.name=monitoring); empty = none."
    )
    namespaces: str = Field("", description="Comma-separated namespaces to watch; empty = cluster-wide.")
    default_storage_class: str = Field("", description="Storage class of the claims the operator creates for runs that name none; empty = the cluster's default class.")
    batch_scheduler: Literal["", "volcano", "yunikorn"] = Field(
        "", description="KubeRay's batch scheduler (its --batch-scheduler), used for runs with spec.scheduling.gang.enabled; empty = none (such runs are refused)."
    )
    webhook_enabled: bool = Field(False, description="Serve the validating admission webhook.")
    webhook_port: int = Field(9443, ge=1, le=65535, description="Port of the admission webhook (HTTPS).")
    webhook_cert_dir: str = Field("/etc/retool/webhook", description="Directory holding tls.crt and tls.key of the webhook.")
    bind_address: str = Field("0.0.0.0", description="Address the webhook and liveness endpoints listen on (all interfaces in a pod).")
    liveness_port: int = Field(8080, ge=1, le=65535, description="Port of kopf's liveness endpoint (/healthz).")
    mlflow_parent_runs: bool = Field(True, description="Create a parent MLflow run per RetoolRun (needs retool.tracking and a reachable server).")
    price_per_device_hour: float | None = Field(
        None, ge=0, description="Default price of one device-hour for status.cost (a run's spec.cost overrides it); empty: hours only."
    )
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the default price.")
    resync_seconds: float = Field(30.0, gt=0, description="Re-derive every run's status from its children at least this often.")
    mlflow_retry_seconds: float = Field(30.0, gt=0, description="Wait before retrying an unreachable MLflow server.")
    mlflow_grace_seconds: float = Field(300.0, ge=0, description="Start stages without a parent MLflow run once MLflow has been unreachable this long.")
    sandbox_user_namespaces: bool = Field(
        False,
        description=(
            "Run every sandbox pod in its own user namespace (hostUsers: false) as root of that namespace, so each execution gets its own uid;"
            " needs UserNamespacesSupport (on by default since Kubernetes 1.33), containerd >= 2.0 or CRI-O >= 1.25 and Linux >= 6.3 on the nodes."
            " false: a non-root pod (uid 10001, no capabilities) isolated by Landlock and seccomp."
        ),
    )
    sandbox_sys_admin: bool = Field(
        True,
        description=(
            "With sandbox_user_namespaces: add SYS_ADMIN (valid only inside the pod's user namespace) so every sandbox worker gets its own pid,"
            " network and mount namespaces; needs the run namespace's Pod Security level at privileged. false keeps to what baseline admits."
        ),
    )
    own_namespace: str = Field("", description="Namespace of the operator's pods (the chart sets it): the sandbox NetworkPolicy admits them to read /readyz.")
    own_pod_selector: str = Field(
        "", description="key=value[,key=value] labels of the operator's pods (the chart sets them); with own_namespace, the pods each sandbox admits on its port."
    )
    sandbox_max_replicas: int = Field(
        DEFAULT_SANDBOX_MAX_REPLICAS,
        ge=1,
        le=MAX_SANDBOX_REPLICAS,
        description="Sandbox replicas one RetoolRun may ask for (ceil(maxConcurrent / perReplicaConcurrency)); admission refuses more."
    )

    @field_validator("ascend_node_selector", "metrics_scraper_namespaces", "own_pod_selector")
    @classmethod
    def _selector_is_pairs(cls, value: str) -> str:
        parse_selector(value)
        return value

    @property
    def namespace_list(self) -> list[str]:
        return [ns.strip() for ns in self.namespaces.split(",") if ns.strip()]

    @property
    def ascend_selector(self) -> dict[str, str]:
        return parse_selector(self.ascend_node_selector)

    @property
    def metrics_scraper_selector(self) -> dict[str, str]:
        return parse_selector(self.metrics_scraper_namespaces)

    @property
    def own_pods(self) -> tuple[str, dict[str, str]] | None:
        """(namespace, pod labels) of the operator's own pods, when the deployment said (else None)."""
        labels = parse_selector(self.own_pod_selector)
        return (self.own_namespace, labels) if self.own_namespace and labels else None


def parse_selector(text: str) -> dict[str, str]:
    """``a=b,c=d`` -> ``{"a": "b", "c": "d"}``; a clear error on anything else."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"node selector entry {part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out
