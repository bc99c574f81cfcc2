"""Rules of ``spec.pods`` (and the sandbox's placement) that a field type alone cannot say.

Each Kubernetes "exactly one of" (an env var's value or valueFrom, a volume's source) and every
clash with what the operator itself sets on a pod (its labels, environment, volumes and mount
paths) is refused here with the field to change: a clash would otherwise be silently dropped
(the operator's value wins) or make the API server refuse the pod after the run has started.
"""

from __future__ import annotations

import posixpath

from retool.runtime.context import (
    ENV_ATTEMPT,
    ENV_IMAGE,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_PARENT_RUN,
    ENV_MLFLOW_URI,
    ENV_NAMESPACE,
    ENV_RUN_NAME,
    ENV_RUN_UID,
    ENV_SANDBOX_URL,
)
from retool.spec.model import RetoolRunSpec
from retool.spec.names import RESERVED_LABEL_PREFIXES, RESERVED_LABELS, RESERVED_VOLUME_NAMES, SHM_PATH, SPEC_DIRECTORY
from retool.spec.pods import VOLUME_SOURCES
from retool.spec.problem import Problem

OPERATOR_ENV = frozenset(
    {
        ENV_RUN_NAME,
        ENV_NAMESPACE,
        ENV_RUN_UID,
        ENV_SANDBOX_URL,
        ENV_ATTEMPT,
        ENV_IMAGE,
        ENV_MLFLOW_URI,
        ENV_MLFLOW_EXPERIMENT,
        ENV_MLFLOW_PARENT_RUN,
        "PYTHONUNBUFFERED",
    }
)
"""Variables the operator sets on every stage container (the stage context)."""
S3_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"})
"""Set from storage.s3 when it is configured."""


def _label_problems(path: str, keys: list[str], *, labels: bool) -> list[Problem]:
    problems = []
    for key in keys:
        reason = next((why for prefix, why in RESERVED_LABEL_PREFIXES if key.startswith(prefix)), None)
        if reason is None and labels and key in RESERVED_LABELS:
            reason = "set by the Job controller"
        if reason is not None and (labels or key.startswith(("retool.dev/", "kopf.retool.dev/"))):
            problems.append(Problem(f"{path}.{key}", f"cannot be set here: {reason}"))
    return problems


def _env_problems(spec: RetoolRunSpec) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    s3 = spec.storage.s3
    for i, var in enumerate(spec.pods.env):
        path = f"spec.pods.env[{i}]"
        if var.name in OPERATOR_ENV or var.name.startswith("RETOOL_"):
            problems.append(Problem(f"{path}.name", f"{var.name} is set by the operator (the stage context) and cannot be overridden"))
        elif s3 is not None and var.name in S3_ENV:
            problems.append(Problem(f"{path}.name", f"{var.name} is set from spec.storage.s3; configure it there"))
        if var.name in seen:
            problems.append(Problem(f"{path}.name", f"{var.name} is set twice"))
        seen.add(var.name)
        if (var.value is None) == (var.value_from is None):
            problems.append(Problem(path, "set exactly one of value and valueFrom"))
        elif var.value_from is not None and (var.value_from.secret_key_ref is None) == (var.value_from.config_map_key_ref is None):
            problems.append(Problem(f"{path}.valueFrom", "set exactly one of secretKeyRef and configMapKeyRef"))
    for i, source in enumerate(spec.pods.env_from):
        if (source.secret_ref is None) == (source.config_map_ref is None):
            problems.append(Problem(f"spec.pods.envFrom[{i}]", "set exactly one of secretRef and configMapRef"))
    return problems


def _inside(path: str, directory: str) -> bool:
    path, directory = posixpath.normpath(path), posixpath.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/") or directory.startswith(path.rstrip("/") + "/")


def _volume_problems(spec: RetoolRunSpec) -> list[Problem]:
    problems: list[Problem] = []
    names: set[str] = set()
    mounts: list[str] = []
    taken = {SPEC_DIRECTORY: "the run's spec", spec.storage.pvc.mount_path: "the run's claim (storage.pvc.mountPath)", SHM_PATH: "the shared memory"}
    for i, volume in enumerate(spec.pods.volumes):
        path = f"spec.pods.volumes[{i}]"
        sources = volume.sources()
        if len(sources) != 1:
            found = f"found {', '.join(sources)}" if sources else "found none"
            problems.append(Problem(path, f"set exactly one volume type of {', '.join(VOLUME_SOURCES)} ({found})"))
        if volume.name in RESERVED_VOLUME_NAMES:
            problems.append(Problem(f"{path}.name", f"{volume.name} is one of the operator's volumes ({', '.join(sorted(RESERVED_VOLUME_NAMES))}); choose another name"))
        if volume.name in names:
            problems.append(Problem(f"{path}.name", f"{volume.name} is used twice"))
        names.add(volume.name)
        clash = next((what for where, what in taken.items() if _inside(volume.mount_path, where)), None)
        if clash is not None:
            problems.append(Problem(f"{path}.mountPath", f"{volume.mount_path} overlaps {clash}"))
        elif any(_inside(volume.mount_path, other) for other in mounts):
            problems.append(Problem(f"{path}.mountPath", f"{volume.mount_path} overlaps another extra volume's mount path"))
        mounts.append(volume.mount_path)
    return problems


def pod_problems(spec: RetoolRunSpec) -> list[Problem]:
    """Every problem of ``spec.pods`` (labels, annotations, environment, volumes)."""
    return [
        *_label_problems("spec.pods.labels", list(spec.pods.labels), labels=True),
        *_label_problems("spec.pods.annotations", list(spec.pods.annotations), labels=False),
        *_env_problems(spec),
        *_volume_problems(spec),
    ]
