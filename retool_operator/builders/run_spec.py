"""The spec snapshot ConfigMap of each stage child (``<child>-spec``): the run as that attempt reads it,
mounted at /etc/retool in every pod of the child.

One snapshot per attempt, created with the child and never patched: a later edit of the run (even
one the webhook or the operator refuses) never reaches a stage that already started, whether it
runs, waits in a queue or resumes after a preemption, and the operator reads the spec a started
stage runs with from it (``runner``'s immutability check).
"""

from __future__ import annotations

from typing import Any

import yaml

from retool.spec.model import RetoolRun
from retool_operator import constants as c
from retool_operator.builders.meta import labels, object_meta, run_namespace


def spec_configmap_name(child_name: str) -> str:
    """The snapshot of the child ``child_name`` (``<run>-<stage>-<attempt>``)."""
    return f"{child_name}-spec"


def run_document(run: RetoolRun) -> dict[str, Any]:
    """The run as the stages read it: every default filled in, no status, no server metadata."""
    return {
        "apiVersion": c.RUN_API_VERSION,
        "kind": c.RUN_KIND,
        "metadata": {"name": run.metadata.name, "namespace": run_namespace(run)},
        "spec": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def build_spec_configmap(run: RetoolRun, child_name: str) -> dict[str, Any]:
    """The snapshot of ``run`` for its child ``child_name`` (created once, before the child)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(spec_configmap_name(child_name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SPEC)),
        "data": {c.SPEC_KEY: yaml.safe_dump(run_document(run), sort_keys=False)},
    }
