# ruff: noqa: F811  (the integration tests take test_integration's `cluster` fixture, imported below)
"""The preflight stage in the operator's stage machine: after prepare, before any accelerator.

A CPU Job runs ``retool.stage preflight`` against one sandbox replica. A check that would fail the
same way on every attempt (bad data, a tokenizer without a chat template, a reward that breaks
the trainer's batch) ends the Job through its ``podFailurePolicy`` and the run fails at once, with
the preflight's own reason from the container's termination message; a sandbox that does not
answer yet (its own exit code) is retried like any failed attempt. Either way no RayJob is
created before the preflight succeeded. A text-only run has no sandbox: its preflight starts
without one, and its Job gets no sandbox URL (the preflight then skips its tool and sandbox checks).
"""

from __future__ import annotations

from typing import Any

import pytest

from retool.preflight.checks import BY_NAME, CHECKS, PERMANENT_EXIT_CODES
from retool.runtime.context import ENV_SANDBOX_URL
from retool.spec.names import sandbox_name, sandbox_url
from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.builders import build_stage_child
from retool_operator.builders.meta import Tracking
from retool_operator.builders.stages import JOB_RESOURCES, STAGE_CONTAINER
from retool_operator.reconcile import CreateChild, Observed, decide
from retool_operator.runner import termination_message
from tests.operator.emulator import DEPLOYMENTS, JOBS, RAYJOBS, eventually, operator_requests, running_operator
from tests.operator.helpers import CONFIG, T0, job_status, run_of
from tests.operator.test_integration import NS, Cluster, cluster, spec_doc, stage_of  # noqa: F401  (the fixture)

PREFLIGHT = {"enabled": True}
TEXT_ONLY = {"recipe": "text-only", "sft": {"enabled": False}}
REASON = "preflight failed: tokenizer: Qwen/Qwen2.5-32B-Instruct has no chat template (exit 11)"


def failed_by_policy(message: str = "Container stage for pod ml/demo-preflight-1-x failed with exit code 11 matching FailJob rule at index 0") -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": message}]}}


def status_after_prepare(preflight: tuple[str, int] = ("Running", 1)) -> RetoolRunStatus:
    state, attempt = preflight
    return RetoolRunStatus(
        stages=[
            StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"),
            StageStatus(name="preflight", state=state, attempt=attempt, job=f"demo-preflight-{attempt}" if attempt else None),
        ]
    )


def stage(status: RetoolRunStatus, name: str) -> StageStatus:
    return next(s for s in status.stages if s.name == name)


def test_prepare_done_starts_the_preflight_with_one_sandbox_replica() -> None:
    run = run_of(preflight=PREFLIGHT)
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    decision = decide(run, status, Observed(children={"demo-prepare-1": job_status("Complete")}), T0)
    assert decision.create == [CreateChild("preflight", 1)]
    assert decision.status.phase == "Preflight"
    assert decision.sandbox_replicas == 1  # a few scripted rollouts, not maxConcurrent's 2 replicas


def test_a_text_only_run_starts_its_preflight_without_a_sandbox() -> None:
    run = run_of(preflight=PREFLIGHT, **TEXT_ONLY)
    status = RetoolRunStatus(stages=[StageStatus(name="prepare", state="Running", attempt=1, job="demo-prepare-1")])
    decision = decide(run, status, Observed(children={"demo-prepare-1": job_status("Complete")}), T0)
    assert decision.create == [CreateChild("preflight", 1)]
    assert decision.sandbox_replicas == 0 and decision.status.sandbox is None
    assert "SandboxReady" not in {c.type for c in decision.status.conditions}, "nothing waits for a sandbox that is never created"


@pytest.mark.parametrize(
    ("spec", "url"),
    [({}, sandbox_url("demo", "ml")), (TEXT_ONLY, None)],
    ids=["a tool run's preflight gets the sandbox URL", "a text-only run's preflight gets none"],
)
def test_the_preflight_jobs_sandbox_url(spec: dict[str, Any], url: str | None) -> None:
    job = build_stage_child(run_of(preflight=PREFLIGHT, **spec), "preflight", 1, config=CONFIG, tracking=Tracking())
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get(ENV_SANDBOX_URL) == url


def test_a_passed_preflight_starts_sft() -> None:
    run = run_of(preflight=PREFLIGHT)
    decision = decide(run, status_after_prepare(), Observed(children={"demo-preflight-1": job_status("Complete")}), T0)
    assert decision.create == [CreateChild("sft", 1)]
    assert decision.sandbox_replicas == 0


def test_a_permanent_preflight_failure_fails_the_run_at_once_with_the_preflights_reason() -> None:
    run = run_of(preflight=PREFLIGHT)
    observed = Observed(children={"demo-preflight-1": failed_by_policy()}, failure_details={"demo-preflight-1": REASON})
    decision = decide(run, status_after_prepare(), observed, T0)
    entry = stage(decision.status, "preflight")
    assert (entry.state, decision.status.phase, decision.create) == ("Failed", "Failed", [])
    assert REASON in (entry.message or "") and "not retried" in (entry.message or "")
    assert stage(decision.status, "sft").attempt == 0  # nothing requested an accelerator
    assert {c.type: c.status for c in decision.status.conditions}["Stalled"] == "True"


def test_a_sandbox_that_does_not_answer_yet_is_retried() -> None:
    run = run_of(preflight=PREFLIGHT)
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}}
    observed = Observed(children={"demo-preflight-1": failed}, failure_details={"demo-preflight-1": "preflight failed: sandbox: connection refused (exit 16)"})
    decision = decide(run, status_after_prepare(), observed, T0)
    entry = stage(decision.status, "preflight")
    assert entry.state == "Retrying" and "connection refused" in (entry.message or "")


def test_the_preflight_job_fails_at_once_on_every_deterministic_check_and_not_on_the_sandbox() -> None:
    job = build_stage_child(run_of(preflight=PREFLIGHT), "preflight", 1, config=CONFIG, tracking=Tracking())
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["containerName"] == STAGE_CONTAINER
    assert set(rule["onExitCodes"]["values"]) == {c.exit_code for c in CHECKS} - {BY_NAME["sandbox"].exit_code}
    assert tuple(rule["onExitCodes"]["values"]) == PERMANENT_EXIT_CODES
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["command"][:6] == ["python3", "-m", "retool.runtime.cpu_only", "-m", "retool.stage", "preflight"]
    assert container["resources"] == JOB_RESOURCES["preflight"]
    assert not any(k.endswith("gpu") or "Ascend" in k for k in container["resources"]["limits"])


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            {"status": {"containerStatuses": [{"name": "stage", "state": {"terminated": {"exitCode": 11, "message": "preflight failed:\n  tokenizer"}}}]}},
            "preflight failed: tokenizer",
        ),
        ({"status": {"containerStatuses": [{"name": "other", "state": {"terminated": {"message": "not ours"}}}]}}, ""),
        ({"status": {"containerStatuses": [{"name": "stage", "lastState": {"terminated": {"message": "x" * 900}}, "state": {}}]}}, "..." + "x" * 600),
        ({}, ""),
    ],
    ids=["message-on-one-line", "another-container", "long-message-keeps-its-end", "no-status"],
)
def test_termination_message(pod: dict[str, Any], expected: str) -> None:
    assert termination_message(pod, "stage") == expected


async def sandbox_up(cluster: Cluster, run: str) -> None:
    """What the Deployment controller reports once a sandbox replica is ready (the emulator runs none):
    the preflight Job waits for it (``retool_operator.sandbox_gate``)."""
    await cluster.finish(DEPLOYMENTS, sandbox_name(run), {"status": {"replicas": 1, "readyReplicas": 1}})


@pytest.mark.slow
async def test_a_broken_run_fails_at_preflight_and_no_rayjob_is_created(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("broken", preflight=PREFLIGHT))
        await cluster.finish(JOBS, "broken-prepare-1", job_status("Complete"))
        await sandbox_up(cluster, "broken")
        job = await cluster.child(JOBS, "broken-preflight-1")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "broken-preflight-1-abcde", "namespace": NS, "labels": dict(job["spec"]["template"]["metadata"]["labels"])},
            "spec": job["spec"]["template"]["spec"],
        }
        await cluster.api.create(pod)
        await cluster.api.patch(
            cluster_pods(), NS, "broken-preflight-1-abcde",
            {"status": {"phase": "Failed", "containerStatuses": [{"name": STAGE_CONTAINER, "state": {"terminated": {"exitCode": 11, "message": REASON}}}]}},
            subresource="status",
        )
        await cluster.finish(JOBS, "broken-preflight-1", failed_by_policy())
        status = await cluster.phase_is("broken", "Failed")
        assert REASON in stage_of(status, "preflight")["message"]

        async def refused() -> Any:
            return await cluster.api.get(JOBS, NS, "broken-preflight-2") is None or None

        await eventually(refused, what="no second preflight attempt")
    assert [r for r in operator_requests(cluster.k8s) if r[1] == "rayjobs" and r[2] == "create"] == []


@pytest.mark.slow
async def test_a_passed_preflight_hands_over_to_sft(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("checked", preflight=PREFLIGHT))
        await cluster.finish(JOBS, "checked-prepare-1", job_status("Complete"))
        await sandbox_up(cluster, "checked")
        await cluster.finish(JOBS, "checked-preflight-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "checked-sft-1")
        status = await cluster.status("checked")
        assert stage_of(status, "preflight")["state"] == "Succeeded"


@pytest.mark.slow
async def test_a_text_only_run_goes_through_preflight_to_rl_without_ever_creating_a_sandbox(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("plain", preflight=PREFLIGHT, **TEXT_ONLY))
        await cluster.finish(JOBS, "plain-prepare-1", job_status("Complete"))
        job = await cluster.child(JOBS, "plain-preflight-1")
        assert ENV_SANDBOX_URL not in {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        await cluster.finish(JOBS, "plain-preflight-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "plain-rl-1")
        status = await cluster.status("plain")
        assert stage_of(status, "preflight")["state"] == "Succeeded" and "sandbox" not in status
    assert sandbox_name("plain") not in await cluster.names(DEPLOYMENTS)


def cluster_pods() -> Any:
    from retool_operator.kube import KINDS

    return KINDS[("v1", "Pod")]


@pytest.mark.slow
async def test_sandbox_pods_refused_at_admission_show_in_sandbox_ready(cluster: Cluster) -> None:
    """The preflight wants one sandbox replica; when its ReplicaSet cannot create the pod (here Pod
    Security refusing the user-namespace shape), the Deployment's ReplicaFailure reaches the run,
    and the preflight Job waits for a ready replica instead of racing it."""
    refusal = 'pods "refused-sandbox-5c6d-x" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities'
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("refused", preflight=PREFLIGHT))
        await cluster.finish(JOBS, "refused-prepare-1", job_status("Complete"))
        failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refusal}
        await cluster.finish(DEPLOYMENTS, sandbox_name("refused"), {"status": {"replicas": 0, "readyReplicas": 0, "conditions": [failure]}})

        async def sandbox_ready() -> dict[str, Any] | None:
            cond = {c["type"]: c for c in (await cluster.status("refused")).get("conditions", [])}.get("SandboxReady")
            return cond if cond and cond["reason"] == "PodsRefused" else None

        cond = await eventually(sandbox_ready, what="SandboxReady PodsRefused")
    assert cond["status"] == "False" and cond["message"].startswith("0/1 replicas ready") and refusal in cond["message"]
    assert await cluster.api.get(JOBS, NS, "refused-preflight-1") is None, "no preflight without a sandbox to check"
    assert stage_of(await cluster.status("refused"), "preflight")["message"].startswith("waiting for the sandbox")
    # A refusal nothing below will resolve while the preflight needs the sandbox: Stalled=True, not "progressing".
    stalled = {c["type"]: c for c in (await cluster.status("refused")).get("conditions", [])}["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "ChildRefused") and refusal in stalled["message"]


WARNINGS = (
    "preflight passed with warnings: eval-data[eval]: the eval would score 3 of 6 problems (aime_2024: 3): 3 are longer than "
    "spec.rl.maxPromptLength (250 tokens) and are dropped; raise spec.rl.maxPromptLength to score them all"
)


def test_a_preflight_that_passed_with_warnings_says_so_in_the_stage_a_condition_and_an_event() -> None:
    run = run_of(preflight=PREFLIGHT)
    observed = Observed(children={"demo-preflight-1": job_status("Complete")}, stage_notes={"demo-preflight-1": WARNINGS})
    decision = decide(run, status_after_prepare(), observed, T0)
    assert decision.create == [CreateChild("sft", 1)], "warnings do not stop the run"
    assert WARNINGS in (stage(decision.status, "preflight").message or "")
    cond = next(c for c in decision.status.conditions if c.type == "PreflightFindings")
    assert (cond.status, cond.reason, cond.message) == ("True", "PreflightWarnings", WARNINGS)
    assert [e.message for e in decision.events if e.reason == "PreflightWarnings"] == [f"stage preflight: {WARNINGS}"]
    later = decide(run, decision.status, Observed(children={"demo-preflight-1": job_status("Complete")}), T0)
    assert next(c for c in later.status.conditions if c.type == "PreflightFindings").message == WARNINGS, "the condition stays"


def test_a_failed_preflight_sets_the_findings_condition_with_its_reason() -> None:
    run = run_of(preflight=PREFLIGHT)
    observed = Observed(children={"demo-preflight-1": failed_by_policy()}, failure_details={"demo-preflight-1": REASON})
    decision = decide(run, status_after_prepare(), observed, T0)
    cond = next(c for c in decision.status.conditions if c.type == "PreflightFindings")
    assert (cond.status, cond.reason, cond.message) == ("True", "PreflightFailed", REASON)


def test_a_clean_preflight_sets_no_findings_condition() -> None:
    run = run_of(preflight=PREFLIGHT)
    decision = decide(run, status_after_prepare(), Observed(children={"demo-preflight-1": job_status("Complete")}), T0)
    assert "PreflightFindings" not in {c.type for c in decision.status.conditions}
