"""Admission checks: the same pydantic validation as ``retool validate``, plus update rules.

Pure functions over the admission review's objects; the kopf handler (``validate-retoolrun`` in
``handlers``) turns a non-empty answer into an AdmissionError. The create handler runs the same
``spec_problems`` on clusters without the webhook.
"""

from __future__ import annotations

from typing import Any

from retool.spec.validate import validate_document

# Spec sections a stage reads: once the stage has started, changing them would change (or
# silently diverge from) what ran, so updates touching them are refused.
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "prepare": ("model", "data", "storage"),
    "sft": ("model", "sft", "data"),
    "merge": ("model", "sft"),
    "rl": ("rl", "data"),
    "eval": ("eval", "data"),
}
STARTED = frozenset({"Running", "Retrying", "Succeeded", "Failed", "Suspended"})


def spec_problems(document: dict[str, Any]) -> list[str]:
    """``path: message`` for every problem of a RetoolRun document (empty when valid)."""
    doc = {k: v for k, v in document.items() if k != "status"}
    return [str(p) for p in validate_document(doc)]


def update_problems(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Changes to the inputs of stages that already started (per the old object's status)."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    stages = ((old.get("status") or {}).get("stages")) or []
    started = [s.get("name") for s in stages if s.get("state") in STARTED]
    problems: list[str] = []
    seen: set[str] = set()
    for stage in started:
        for section in STAGE_INPUTS.get(stage, ()):
            if section in seen or old_spec.get(section) == new_spec.get(section):
                continue
            seen.add(section)
            problems.append(f"spec.{section}: cannot change after stage {stage} started (it would change what ran); create a new RetoolRun instead")
    return problems


def review(operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> list[str]:
    """Every reason to refuse a CREATE or UPDATE of a RetoolRun (empty = admit)."""
    if operation not in ("CREATE", "UPDATE") or not new:
        return []
    problems = spec_problems(new)
    if operation == "UPDATE" and old:
        problems += update_problems(old, new)
    return problems
