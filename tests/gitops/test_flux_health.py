"""The Flux health check (CEL `healthCheckExprs`, evaluated by a real CEL interpreter) and the Argo CD
health check (Lua) read the same status field and agree on every sample object, and the GitOps smoke
test deploys exactly the smoke example."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
import yaml
from celpy.evaluation import CELEvalError

from retool.spec.validate import parse_run
from tests.conftest import REPO
from tests.gitops.test_argocd_health import SCRIPT, health, run
from tests.gitops.test_gitops import GITOPS, kustomize

FLUX = yaml.safe_load((GITOPS / "flux" / "retool-smoke.yaml").read_text())
(CHECK,) = [c for c in FLUX["spec"]["healthCheckExprs"] if (c["apiVersion"], c["kind"]) == ("retool.dev/v1alpha1", "RetoolRun")]


def flux_health(obj: dict[str, Any]) -> str:
    """kstatus result of Flux's CEL status reader: inProgress, then failed, then current; an
    expression that cannot be evaluated (a field not there yet) leaves the object in progress."""
    env = celpy.Environment()
    activation = {key: celpy.json_to_cel(obj[key]) for key in ("metadata", "spec", "status") if key in obj}
    for name, verdict in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if name not in CHECK:
            continue
        try:
            result = env.program(env.compile(CHECK[name])).evaluate(activation)
        except CELEvalError:
            return "InProgress"
        if isinstance(result, CELEvalError):
            return "InProgress"
        if bool(result):
            return verdict
    return "InProgress"


AGREES = {"Healthy": "Current", "Degraded": "Failed", "Progressing": "InProgress", "Suspended": "InProgress"}
OBJECTS = [
    run(),
    run({}),
    run({"phase": "Pending"}),
    run({"phase": "SFT", "stage": "sft", "progress": "sft 2/6"}),
    run({"phase": "RL", "stages": [{"name": "rl", "state": "Queued", "attempt": 1, "preemptions": 1}]}),
    run({"phase": "Succeeded", "score": 0.67}),
    run({"phase": "Failed", "message": "stage prepare not started: claim ReadWriteOnce"}),
    run({"phase": "Suspended"}),
    run({"phase": "RL"}, suspend=True),
    run(None, suspend=True),
]


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: str(o.get("status", {}).get("phase", "no status")) + (" suspended" if o["spec"].get("suspend") else ""))
def test_flux_and_argo_cd_agree(obj: dict[str, Any]) -> None:
    assert flux_health(obj) == AGREES[health(obj)["status"]]


def test_both_read_status_phase() -> None:
    assert all("status.phase" in CHECK[key] for key in ("inProgress", "failed", "current"))
    assert "status.phase" in SCRIPT


def test_flux_waits_for_the_smoke_test_within_its_timeout() -> None:
    assert FLUX["spec"]["wait"] is True and FLUX["spec"]["path"] == "./smoke"
    assert (GITOPS / "smoke" / "kustomization.yaml").is_file()


def test_the_gitops_smoke_run_is_the_smoke_example() -> None:
    (doc,) = kustomize(GITOPS / "smoke")
    example = yaml.safe_load((REPO / "examples" / "retoolrun-smoke-qwen0.5b.yaml").read_text())
    assert doc["spec"] == example["spec"]
    assert doc["metadata"]["name"] == example["metadata"]["name"] + "-s1" and doc["metadata"]["namespace"] == "ml-team"
    assert parse_run(doc).spec.data.max_rows == 32
