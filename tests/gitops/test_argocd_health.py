"""The Argo CD health check for RetoolRun, run by a real Lua 5.1 interpreter (Argo CD's gopher-lua
implements 5.1) against sample objects, and the argocd-cm patch carrying the same script."""

from __future__ import annotations

from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml

from tests.conftest import REPO

ARGOCD = REPO / "examples" / "gitops" / "argocd"
SCRIPT = (ARGOCD / "health-retoolrun.lua").read_text()


def health(obj: dict[str, Any]) -> dict[str, str]:
    """What Argo CD computes: the script runs with the live object as the global ``obj``."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return dict(result.items())


def run(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": {"name": "r", "generation": 1}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


FAILED_CONDITION = {"type": "Failed", "status": "True", "reason": "StageFailed", "message": "rl failed after 3 attempts: OOMKilled", "lastTransitionTime": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(run(), {"status": "Progressing", "message": "Waiting for the ReTool operator"}, id="no status yet: Progressing"),
        pytest.param(run({}), {"status": "Progressing", "message": "Waiting for the ReTool operator"}, id="empty status: Progressing"),
        pytest.param(run({"phase": "Pending"}), {"status": "Progressing", "message": "Pending"}, id="pending: Progressing"),
        pytest.param(run({"phase": "SFT", "stage": "sft", "progress": "sft 2/6"}), {"status": "Progressing", "message": "SFT: sft 2/6"}, id="SFT running: Progressing"),
        pytest.param(run({"phase": "RL", "progress": "rl 120/400"}), {"status": "Progressing", "message": "RL: rl 120/400"}, id="RL running: Progressing"),
        pytest.param(run({"phase": "Evaluating"}), {"status": "Progressing", "message": "Evaluating"}, id="evaluating: Progressing"),
        pytest.param(run({"phase": "Succeeded"}), {"status": "Healthy", "message": "Succeeded"}, id="succeeded: Healthy"),
        pytest.param(run({"phase": "Succeeded", "score": 0.67}), {"status": "Healthy", "message": "Succeeded, AIME score 0.67"}, id="succeeded with a score: Healthy"),
        pytest.param(run({"phase": "Succeeded"}, suspend=True), {"status": "Healthy", "message": "Succeeded"}, id="succeeded then suspended: still Healthy"),
        pytest.param(
            run({"phase": "Failed", "message": "latest event", "conditions": [FAILED_CONDITION]}),
            {"status": "Degraded", "message": "rl failed after 3 attempts: OOMKilled"},
            id="failed: Degraded with the Failed condition's message",
        ),
        pytest.param(run({"phase": "Failed", "message": "invalid spec"}), {"status": "Degraded", "message": "invalid spec"}, id="failed without conditions"),
        pytest.param(run({"phase": "Failed"}, suspend=True), {"status": "Degraded", "message": "Failed"}, id="failed and suspended: Degraded wins"),
        pytest.param(run({"phase": "Suspended", "message": "at rl 120/400"}), {"status": "Suspended", "message": "at rl 120/400"}, id="operator reports Suspended"),
        pytest.param(run({"phase": "RL"}, suspend=True), {"status": "Suspended", "message": "Suspended (spec.suspend is true)"}, id="suspend requested while running"),
        pytest.param(run(None, suspend=True), {"status": "Suspended", "message": "Suspended before the operator started it"}, id="created suspended"),
    ],
)
def test_health(obj: dict[str, Any], expected: dict[str, str]) -> None:
    assert health(obj) == expected


def test_argocd_cm_patch_carries_the_tested_script() -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    assert (patch["kind"], patch["metadata"]["name"], patch["metadata"]["namespace"]) == ("ConfigMap", "argocd-cm", "argocd")
    assert patch["data"] == {"resource.customizations.health.retool.dev_RetoolRun": SCRIPT}
