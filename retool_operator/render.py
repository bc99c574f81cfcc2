"""``retool render --manifests``: the child objects the operator would create, without a cluster.

Uses the same builders as the operator. Owner references are included when the document carries
a ``metadata.uid`` (e.g. ``kubectl get rr NAME -o yaml``), except on a created claim that outlives
the run (storage.retain: keep); stage environments show the tracking URI the operator would resolve
but no parent MLflow run id (that needs the MLflow server). The operator's settings come from
``RETOOL_OPERATOR_*`` variables, as in the operator (e.g. ``RETOOL_OPERATOR_BATCH_SCHEDULER``).
"""

from __future__ import annotations

from typing import Any

import yaml

from retool.spec.names import STAGES
from retool.spec.problem import Problem
from retool.spec.validate import SpecError, parse_run
from retool_operator.builders import (
    Tracking,
    build_claim,
    build_sandbox,
    build_spec_configmap,
    build_stage_child,
    desired_sandbox_replicas,
    experiment_name,
    owned_by,
    run_claim,
    scheduling_problems,
)
from retool_operator.config import OperatorConfig
from retool_operator.reconcile import enabled_stages
from retool_operator.tracking import tracking_target


def desired_objects(document: dict[str, Any], *, config: OperatorConfig | None = None, stage: str | None = None) -> list[dict[str, Any]]:
    """The claim the operator creates (if any), sandbox set, then the given stage's first attempt (or
    every enabled stage's), each after its spec snapshot. Raises SpecError for what this operator would refuse."""
    config = config or OperatorConfig()
    run = parse_run(document)
    problems = scheduling_problems(run, config)
    if problems:
        raise SpecError([Problem(*p.split(": ", 1)) for p in problems])
    if stage is not None and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    target = tracking_target(run, config)
    tracking = Tracking(uri=target.uri, experiment=experiment_name(run))
    stages = [stage] if stage else [s for s, on in enabled_stages(run).items() if on]
    claim = build_claim(run, config)
    owned = list(build_sandbox(run, config=config, replicas=desired_sandbox_replicas(run)))
    for s in stages:
        child = build_stage_child(run, s, 1, config=config, tracking=tracking)
        owned += [build_spec_configmap(run, child["metadata"]["name"]), child]
    uid = (run.metadata.model_extra or {}).get("uid")
    if claim is not None and run_claim(run, config).owned_by_run:
        owned.insert(0, claim)
        claim = None
    if uid:
        owned = [owned_by(obj, run_name=run.metadata.name, run_uid=uid) for obj in owned]
    return [*([claim] if claim is not None else []), *owned]


class _Dumper(yaml.SafeDumper):
    """No anchors/aliases (builders may share label dicts) and multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_manifests(document: dict[str, Any], *, config: OperatorConfig | None = None, stage: str | None = None) -> str:
    """Multi-document YAML of ``desired_objects``; raises SpecError for an invalid RetoolRun."""
    return yaml.dump_all(desired_objects(document, config=config, stage=stage), Dumper=_Dumper, sort_keys=False)
