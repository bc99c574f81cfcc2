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


# ---------------------------------------------------------------- the operator's own statuses


def kstatus(obj: dict[str, Any]) -> str:
    """What kstatus (sigs.k8s.io/cli-utils/pkg/kstatus, used by Flux's health checks and kpt)
    computes for a custom resource: generation not observed or Reconciling=True -> InProgress,
    Stalled=True -> Failed, anything else -> Current (its generic rules, in order)."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    generation, observed = obj["metadata"].get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and generation != observed:
        return "InProgress"
    for cond in status.get("conditions") or []:
        if cond["type"] == "Reconciling" and cond["status"] == "True":
            return "InProgress"
        if cond["type"] == "Stalled" and cond["status"] == "True":
            return "Failed"
    return "Current"


def operator_statuses() -> dict[str, tuple[dict[str, Any], bool]]:
    """Statuses the operator's decision function writes for a run in each situation (and whether spec.suspend is set)."""
    import datetime as dt

    from retool.spec.status import RetoolRunStatus, StageStatus
    from retool_operator.reconcile import Observed, decide
    from retool_operator.status import dump, invalid_spec_status, with_refusals
    from tests.operator.helpers import T0, rayjob_status, run_of

    def stages(**states: tuple[str, int]) -> list[StageStatus]:
        out = []
        for n in ("prepare", "sft", "merge", "rl", "eval"):
            state, attempt = states.get(n, ("Pending", 0))
            out.append(StageStatus(name=n, state=state, attempt=attempt, job=f"demo-{n}-1"))
        return out

    def status_of(run: Any, current: list[StageStatus], children: dict[str, Any]) -> RetoolRunStatus:
        return decide(run, RetoolRunStatus(stages=current), Observed(children=children), T0).status

    run = run_of()
    done = {n: ("Succeeded", 1) for n in ("prepare", "sft", "merge", "rl")}
    failed_job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    retry = status_of(run, stages(prepare=("Succeeded", 1), sft=("Running", 1)), {"demo-sft-1": rayjob_status("Complete", "FAILED")})
    refused = with_refusals(
        retry, ["create RayJob demo-sft-2 refused: exceeded quota: gpu-quota"], previous=retry.conditions, now=T0 + dt.timedelta(seconds=1), generation=None
    )
    running = {**done, "rl": ("Running", 1)}
    out: dict[str, tuple[dict[str, Any], bool]] = {
        "new": (dump(status_of(run, [], {})), False),
        "rl running": (dump(status_of(run, stages(**running), {"demo-rl-1": rayjob_status("Running", "RUNNING")})), False),
        "retrying": (dump(retry), False),
        "failed": (dump(status_of(run_of(failurePolicy={"maxRetries": 0}), stages(prepare=("Running", 1)), {"demo-prepare-1": failed_job})), False),
        "succeeded": (dump(status_of(run, stages(**done, eval=("Running", 1)), {"demo-eval-1": rayjob_status("Complete", "SUCCEEDED")})), False),
        "suspended": (dump(status_of(run_of(suspend=True), stages(prepare=("Succeeded", 1), sft=("Running", 1)), {"demo-sft-1": rayjob_status("Running")})), True),
        "refused": (dump(refused), False),
        "invalid spec": (dump(invalid_spec_status(RetoolRunStatus(), ["spec.rl.steps: bad"], now=T0, generation=None)), False),
    }
    return out


AGREEMENT = {
    # situation: (Argo CD health, kstatus)
    "new": ("Progressing", "InProgress"),
    "rl running": ("Progressing", "InProgress"),
    "retrying": ("Progressing", "InProgress"),
    "failed": ("Degraded", "Failed"),
    "succeeded": ("Healthy", "Current"),
    "suspended": ("Suspended", "Current"),
    "refused": ("Degraded", "Failed"),
    "invalid spec": ("Degraded", "Failed"),
}


@pytest.mark.parametrize("situation", sorted(AGREEMENT))
def test_argo_cd_and_kstatus_agree_on_the_operators_statuses(situation: str) -> None:
    status, suspend = operator_statuses()[situation]
    obj = run(status, suspend=suspend) if suspend else run(status)
    argo, flux = AGREEMENT[situation]
    assert health(obj)["status"] == argo
    assert kstatus(obj) == flux
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == ("True" if situation == "succeeded" else "False")  # Ready means finished successfully


def test_degraded_shows_the_api_servers_refusal() -> None:
    status, _ = operator_statuses()["refused"]
    assert "exceeded quota: gpu-quota" in health(run(status))["message"]


def test_an_unobserved_spec_edit_is_in_progress_for_kstatus() -> None:
    status, _ = operator_statuses()["succeeded"]
    obj = run({**status, "observedGeneration": 1})
    obj["metadata"]["generation"] = 2
    assert kstatus(obj) == "InProgress"
