"""The ``<run>-spec`` ConfigMap: the run as the stages read it, mounted at /etc/retool in every stage pod."""

from __future__ import annotations

from typing import Any

import yaml

from retool.spec.model import RetoolRun
from retool_operator import constants as c
from retool_operator.builders.meta import labels, object_meta, run_namespace


def spec_configmap_name(run_name: str) -> str:
    return f"{run_name}-spec"


def run_document(run: RetoolRun) -> dict[str, Any]:
    """The run as the stages read it: every default filled in, no status, no server metadata."""
    return {
        "apiVersion": c.RUN_API_VERSION,
        "kind": c.RUN_KIND,
        "metadata": {"name": run.metadata.name, "namespace": run_namespace(run)},
        "spec": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def build_spec_configmap(run: RetoolRun) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(spec_configmap_name(run.metadata.name), run_namespace(run), labels(run.metadata.name, c.COMPONENT_SPEC)),
        "data": {c.SPEC_KEY: yaml.safe_dump(run_document(run), sort_keys=False)},
    }
