"""Per-run pod settings (``spec.pods``): identity, credentials and extras of a run's pods.

A typed subset of the Kubernetes pod API rather than free-form objects, so that a typo or an
unsupported volume type is an error naming the field (``retool validate``, the CRD schema and
the webhook agree) instead of a pod the API server refuses hours into a run. The subset covers
what platform teams attach to training pods: a service account (IRSA, workload identity),
image pull secrets, environment from Secrets and ConfigMaps (a hub token), labels and
annotations (cost centres, sidecar opt-outs), and volumes (a shared hub cache, certificates).

Secrets are only ever *referenced* (a Secret name and key): the operator never reads a Secret, so
no value can reach the run's status, its spec ConfigMap, MLflow or a log.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from retool.spec.base import K8sName, SpecModel
from retool.spec.quantity import Quantity

# A Secret or ConfigMap key, an environment variable name, a DNS-1123 label (volume names).
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ABSOLUTE_PATH_PATTERN = r"^/[^\s]*$"
RELATIVE_PATH_PATTERN = r"^([^/\s][^\s]*)?$"

ConfigKey = Annotated[str, StringConstraints(pattern=CONFIG_KEY_PATTERN, min_length=1, max_length=253)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, min_length=1, max_length=256)]
VolumeName = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, min_length=1, max_length=63)]
AbsolutePath = Annotated[str, StringConstraints(pattern=ABSOLUTE_PATH_PATTERN, min_length=1, max_length=4096)]
RelativePath = Annotated[str, StringConstraints(pattern=RELATIVE_PATH_PATTERN, max_length=4096)]
FileMode = Annotated[int, Field(ge=0, le=0o777)]


class KeySelector(SpecModel):
    name: K8sName = Field(..., description="Name of the Secret or ConfigMap in the run's namespace.")
    key: ConfigKey = Field(..., description="Key within it.")
    optional: bool | None = Field(None, description="Start the pod even when the object or key does not exist.")


class EnvVarSource(SpecModel):
    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret (the value is never read by the operator).")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")


class EnvVar(SpecModel):
    name: EnvName = Field(..., description="Variable name.")
    value: str | None = Field(None, description="A literal value (kept in the spec: never put a secret here, use valueFrom).")
    value_from: EnvVarSource | None = Field(None, description="The value from a Secret or ConfigMap key.")


class ObjectRef(SpecModel):
    name: K8sName = Field(..., description="Name of the Secret or ConfigMap in the run's namespace.")
    optional: bool | None = Field(None, description="Start the pod even when the object does not exist.")


class EnvFromSource(SpecModel):
    prefix: EnvName | None = Field(None, description="Prefix added to every variable name.")
    secret_ref: ObjectRef | None = Field(None, description="Every key of a Secret as a variable.")
    config_map_ref: ObjectRef | None = Field(None, description="Every key of a ConfigMap as a variable.")


class KeyToPath(SpecModel):
    key: ConfigKey = Field(..., description="Key of the Secret or ConfigMap.")
    path: Annotated[str, StringConstraints(pattern=r"^[^/\s][^\s]*$", max_length=4096)] = Field(..., description="Relative file path in the volume.")
    mode: FileMode | None = Field(None, description="File mode bits (octal 0-0777 as a decimal number).")


class PVCVolumeSource(SpecModel):
    claim_name: K8sName = Field(..., description="An existing PersistentVolumeClaim in the run's namespace.")
    read_only: bool | None = Field(None, description="Mount the claim read-only.")


class ConfigMapVolumeSource(SpecModel):
    name: K8sName = Field(..., description="ConfigMap in the run's namespace.")
    items: list[KeyToPath] | None = Field(None, description="Only these keys, at these paths; every key when unset.")
    default_mode: FileMode | None = Field(None, description="File mode bits of the files (decimal).")
    optional: bool | None = Field(None, description="Start the pod even when the ConfigMap does not exist.")


class SecretVolumeSource(SpecModel):
    secret_name: K8sName = Field(..., description="Secret in the run's namespace.")
    items: list[KeyToPath] | None = Field(None, description="Only these keys, at these paths; every key when unset.")
    default_mode: FileMode | None = Field(None, description="File mode bits of the files (decimal).")
    optional: bool | None = Field(None, description="Start the pod even when the Secret does not exist.")


class EmptyDirVolumeSource(SpecModel):
    medium: Literal["", "Memory"] | None = Field(None, description="'' (node disk) or Memory (tmpfs).")
    size_limit: Quantity | None = Field(None, description="Size limit, a Kubernetes quantity.")


class NFSVolumeSource(SpecModel):
    server: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(..., description="Host name or IP address of the NFS server.")
    path: AbsolutePath = Field(..., description="Exported path.")
    read_only: bool | None = Field(None, description="Mount the export read-only.")


class CSIVolumeSource(SpecModel):
    driver: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]$", max_length=63)] = Field(
        ..., description="Name of the CSI driver (e.g. a hub-cache or secrets-store driver)."
    )
    read_only: bool | None = Field(None, description="Mount the volume read-only.")
    fs_type: str | None = Field(None, description="Filesystem type, when the driver needs one.")
    volume_attributes: dict[str, str] = Field(default_factory=dict, description="Driver-specific attributes.")
    node_publish_secret_ref: ObjectRef | None = Field(None, description="Secret passed to the driver's NodePublishVolume call.")


VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "nfs", "csi")
"""The supported volume types (camelCase, as in the YAML)."""


class PodVolume(SpecModel):
    """One extra volume and where it is mounted in every container of the pods that get it."""

    name: VolumeName = Field(..., description="Volume name (a DNS label); must not clash with the operator's volumes.")
    mount_path: AbsolutePath = Field(..., description="Where the volume is mounted in every container.")
    sub_path: RelativePath = Field("", description="Sub-directory of the volume to mount instead of its root.")
    read_only: bool = Field(False, description="Mount read-only.")
    persistent_volume_claim: PVCVolumeSource | None = Field(None, description="An existing claim (e.g. a shared Hugging Face cache).")
    config_map: ConfigMapVolumeSource | None = Field(None, description="A ConfigMap's keys as files.")
    secret: SecretVolumeSource | None = Field(None, description="A Secret's keys as files (e.g. CA certificates).")
    empty_dir: EmptyDirVolumeSource | None = Field(None, description="Scratch space that lives as long as the pod.")
    nfs: NFSVolumeSource | None = Field(None, description="An NFS export.")
    csi: CSIVolumeSource | None = Field(None, description="An inline CSI volume.")

    def sources(self) -> list[str]:
        """The camelCase names of the volume types set (exactly one is valid)."""
        return [field.alias for name, field in type(self).model_fields.items() if field.alias in VOLUME_SOURCES and getattr(self, name) is not None]


LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_PATTERN, max_length=317)]
LabelValue = Annotated[str, StringConstraints(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]


class PodSettingsSpec(SpecModel):
    """Settings added to the pods of a run; see each field for which pods get it."""

    service_account_name: K8sName | None = Field(
        None, description="Service account of every stage pod (e.g. bound to a cloud role for S3 through IRSA or workload identity); the sandbox never gets one."
    )
    image_pull_secrets: list[K8sName] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the trainer and sandbox images, added to every stage pod and the sandbox."
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="Extra labels of every stage pod and the sandbox pods (e.g. a cost centre); the operator's own keys cannot be set."
    )
    annotations: dict[LabelKey, str] = Field(
        default_factory=dict, description="Extra annotations of every stage pod and the sandbox pods (e.g. a sidecar opt-out)."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra environment of the stage containers (Jobs, Ray head and workers); never the sandbox."
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=32, description="Variables from whole Secrets or ConfigMaps, for the stage containers; never the sandbox."
    )
    volumes: list[PodVolume] = Field(
        default_factory=list, max_length=32, description="Extra volumes mounted in the stage containers that mount the run's claim (Jobs, Ray head and workers)."
    )
