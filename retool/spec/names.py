"""Deterministic names of everything a RetoolRun owns.

The operator is level-triggered: it must find the children it created on an earlier pass (or
before a restart) by name alone, so every child name is a pure function of the run name, the
stage and the attempt. The same functions bound the run name: a name that is valid for the
RetoolRun but makes a child name invalid would fail half-way through a pipeline.
"""

from __future__ import annotations

import re

STAGES: tuple[str, ...] = ("prepare", "preflight", "sft", "merge", "rl", "eval")
"""The pipeline, in order. Each stage runs only after the previous one succeeded; preflight is the
last stage before any accelerator is requested."""

RAY_STAGES = frozenset({"sft", "rl", "eval"})
"""Stages that run as KubeRay RayJobs; the others are batch Jobs."""

MAX_RETRIES_LIMIT = 9
"""Upper bound of spec.failurePolicy.maxRetries: attempts are numbered 1..10, at most two digits."""

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_LABEL_LENGTH = 63
# KubeRay rejects RayJob names longer than 47 characters (its RayCluster gets a 6-character
# suffix and must stay within 53) and requires them to be DNS-1035 labels.
MAX_RAYJOB_NAME_LENGTH = 47

SANDBOX_SUFFIX = "-sandbox"
SANDBOX_PORT = 8080


def sandbox_name(run: str) -> str:
    """Deployment, Service, NetworkPolicy and PodDisruptionBudget of the run's code sandbox."""
    return f"{run}{SANDBOX_SUFFIX}"


def sandbox_url(run: str, namespace: str) -> str:
    """In-cluster URL of the run's sandbox Service (what the code-interpreter tool calls)."""
    return f"http://{sandbox_name(run)}.{namespace}.svc:{SANDBOX_PORT}"


def stage_child_name(run: str, stage: str, attempt: int = 1) -> str:
    """The Job or RayJob of one attempt of a stage: ``<run>-<stage>-<attempt>``.

    A retry is a new object (a RayJob cannot be restarted in place), so the attempt number is
    part of the name and the operator can tell attempts apart after a restart.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return f"{run}-{stage}-{attempt}"


def child_name_limits() -> list[tuple[str, int]]:
    """Every (longest child-name suffix, length limit that child has)."""
    last_attempt = MAX_RETRIES_LIMIT + 1
    limits = [(SANDBOX_SUFFIX, MAX_LABEL_LENGTH)]
    for stage in STAGES:
        suffix = stage_child_name("x", stage, last_attempt)[1:]
        limit = MAX_RAYJOB_NAME_LENGTH if stage in RAY_STAGES else MAX_LABEL_LENGTH
        limits.append((suffix, limit))
    return limits


def max_run_name_length() -> int:
    """The longest run name for which every child name stays valid."""
    return min(limit - len(suffix) for suffix, limit in child_name_limits())


def run_name_problems(name: str) -> list[str]:
    """Why ``name`` cannot name a RetoolRun (empty when it can)."""
    problems = []
    if not DNS1035_LABEL.match(name):
        problems.append(
            f"{name!r} must be a DNS-1035 label: lower-case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit (child Services and "
            "RayJobs are named after it)"
        )
    longest = max_run_name_length()
    if len(name) > longest:
        worst_suffix, limit = min(child_name_limits(), key=lambda pair: pair[1] - len(pair[0]))
        problems.append(
            f"{name!r} is {len(name)} characters; at most {longest} are allowed so that child "
            f"names such as '{name}{worst_suffix}' stay within {limit} characters"
        )
    return problems


# What the operator itself puts on stage pods: a run's spec.pods may not set these (a clash would
# either be dropped silently or break the pod), so the rules refuse them naming the field.
SPEC_VOLUME = "run-spec"
DATA_VOLUME = "data"
SHM_VOLUME = "dshm"
RESERVED_VOLUME_NAMES = frozenset({SPEC_VOLUME, DATA_VOLUME, SHM_VOLUME})
SPEC_DIRECTORY = "/etc/retool"
SHM_PATH = "/dev/shm"
RESERVED_LABEL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("app.kubernetes.io/", "the operator sets the app.kubernetes.io labels"),
    ("retool.dev/", "the operator's own labels"),
    ("kueue.x-k8s.io/", "set through spec.scheduling"),
    ("ray.io/", "set through spec.scheduling or by KubeRay"),
    ("volcano.sh/", "set through spec.scheduling"),
    ("yunikorn.apache.org/", "set through spec.scheduling"),
    ("batch.kubernetes.io/", "set by the Job controller"),
)
RESERVED_LABELS = frozenset({"job-name", "controller-uid"})
"""Labels the Job controller puts on the pods it creates."""
