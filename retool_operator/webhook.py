"""Admission checks: the same pydantic validation as ``retool validate``, plus update rules.

Pure functions over the admission review's objects; the kopf handler (``validate-retoolrun`` in
``handlers``) turns a non-empty answer into an AdmissionError. The create handler runs the same
``spec_problems`` on clusters without the webhook.

A review always ends in an answer: the objects come from the API server as any JSON, and an old
object whose status was hand-edited or written by another version (a list, a string, stages that
are not objects) is read as far as it makes sense, never raised on.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from retool.spec.model import RetoolRun
from retool.spec.rules import sandbox_replica_problem
from retool.spec.validate import document_warnings, parse_run, validate_document
from retool_operator.builders.scheduling import scheduling_problems
from retool_operator.config import OperatorConfig

# Spec sections a stage reads: once the stage has started, changing them would change (or
# silently diverge from) what ran, so updates touching them are refused. The GPU stages read
# ``hardware`` too: their checkpoints are sharded for its device count, and a retry or a resume
# on other devices would not load them (or would run on nodes the run was not sized for).
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "prepare": ("model", "data", "storage", "recipe"),
    "sft": ("model", "sft", "data", "hardware", "trainer"),
    "merge": ("model", "sft", "trainer"),
    "rl": ("rl", "data", "hardware", "recipe", "trainer"),
    "eval": ("eval", "data", "hardware", "recipe", "trainer"),
}
STARTED = frozenset({"Queued", "Running", "Retrying", "Succeeded", "Failed", "Suspended"})
"""Stage states after the stage's first child exists: Queued is one (created, waiting for admission, or
preempted), so its inputs are as fixed as a running stage's."""


def spec_problems(document: Mapping[str, Any]) -> list[str]:
    """``path: message`` for every problem of a RetoolRun document (empty when valid)."""
    doc = {k: v for k, v in document.items() if k != "status"}
    return [str(p) for p in validate_document(doc)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def started_stages(old: Mapping[str, Any]) -> list[str]:
    """Names of the stages the old object's status says started; entries that are not well-formed are skipped."""
    stages = _mapping(old.get("status")).get("stages")
    if not isinstance(stages, list):
        return []
    return [s["name"] for s in stages if isinstance(s, Mapping) and isinstance(s.get("name"), str) and isinstance(s.get("state"), str) and s["state"] in STARTED]


def update_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Changes to the inputs of stages that already started (per the old object's status)."""
    old_spec, new_spec = _mapping(old.get("spec")), _mapping(new.get("spec"))
    problems: list[str] = []
    seen: set[str] = set()
    for stage in started_stages(old):
        for section in STAGE_INPUTS.get(stage, ()):
            if section in seen or old_spec.get(section) == new_spec.get(section):
                continue
            seen.add(section)
            problems.append(f"spec.{section}: cannot change after stage {stage} started (it would change what ran); create a new RetoolRun instead")
    return problems


def spec_edited(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an UPDATE is an edit of the run to judge: its ``spec`` changed and it is not being deleted.

    Everything else is admitted: metadata-only updates (labels, annotations, kopf's finalizer and its
    progress annotations) and any update of an object with a ``deletionTimestamp`` (the spec of an
    object being deleted can no longer change, and refusing the removal of a finalizer would leave the
    run Terminating with its children). Judging those against the operator's *current* settings
    would refuse them for runs created under older ones (a lowered ``limits.sandboxReplicas``, a new
    ``batchScheduler``).
    """
    if _mapping(new.get("metadata")).get("deletionTimestamp"):
        return False
    return old.get("spec") != new.get("spec")


def review_warnings(operation: str, new: dict[str, Any] | None) -> list[str]:
    """What an admitted CREATE or UPDATE probably got wrong (kubectl prints these as ``Warning:``)."""
    if operation not in ("CREATE", "UPDATE") or not new:
        return []
    return [str(w) for w in document_warnings({k: v for k, v in new.items() if k != "status"})]


@functools.cache
def configured_replica_cap() -> int:
    """The operator's ``sandbox_max_replicas`` (RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS, the chart's limits.sandboxReplicas)."""
    return OperatorConfig().sandbox_max_replicas


def cluster_problems(document: Mapping[str, Any], max_sandbox_replicas: int) -> list[str]:
    """What a valid spec asks of this cluster beyond the operator's limits."""
    run = RetoolRun.model_validate({k: v for k, v in document.items() if k != "status"})
    problem = sandbox_replica_problem(run.spec, max_sandbox_replicas, "sandboxMaxReplicas")
    return [str(problem)] if problem is not None else []


def config_problems(document: Mapping[str, Any], config: OperatorConfig) -> list[str]:
    """What this operator cannot do for a valid run (e.g. gang scheduling without a batch scheduler)."""
    return scheduling_problems(parse_run({k: v for k, v in document.items() if k != "status"}), config)


def review(
    operation: str,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    config: OperatorConfig | None = None,
    *,
    max_sandbox_replicas: int | None = None,
) -> list[str]:
    """Every reason to refuse a CREATE or UPDATE of a RetoolRun (empty = admit).

    ``config`` is the operator's (its limits and batch scheduler); ``max_sandbox_replicas``
    overrides its replica limit, which defaults to the environment's (RETOOL_OPERATOR_*).
    """
    if operation not in ("CREATE", "UPDATE") or not isinstance(new, Mapping) or not new:
        return []
    if operation == "UPDATE" and isinstance(old, Mapping) and old and not spec_edited(old, new):
        return []
    problems = spec_problems(new)
    if not problems:
        cap = max_sandbox_replicas if max_sandbox_replicas is not None else (config.sandbox_max_replicas if config is not None else configured_replica_cap())
        problems += cluster_problems(new, cap)
    if not problems and config is not None:
        problems += config_problems(new, config)
    if operation == "UPDATE" and isinstance(old, Mapping) and old:
        problems += update_problems(old, new)
    return problems
