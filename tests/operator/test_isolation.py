"""The sandbox's isolation in the run's status: /readyz reports parsed and summed up, which pods are
asked, the SandboxIsolation condition, and what the status keeps while nothing can be read."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from retool.sandbox import layers
from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator.isolation import IsolationObservation, ReplicaIsolation, isolation_condition, parse_readyz, summarize
from retool_operator.readyz import IsolationReader, readable_pods
from retool_operator.reconcile import Observed, decide
from tests.operator.helpers import T0, run_of


def readyz_body(**probe_overrides: Any) -> dict[str, Any]:
    """A /readyz body as the server writes it, from the server's own ``layers`` module."""
    base = {"euid": 10001, "uid_switch": False, "namespaces": None, "private_proc": False, "namespace_error": "EPERM", "landlock_abi": 7, "seccomp_error": None}
    plan = layers.decide(layers.Probes(**{**base, **probe_overrides}))  # type: ignore[arg-type]
    return {"ready": True, "not_ready_because": [], "isolation": layers.describe(plan)}


STRONG_ROOT = readyz_body(euid=0, uid_switch=True, namespaces="root-namespaces", private_proc=True)
STRONG_NONROOT = readyz_body()
WEAK = readyz_body(landlock_abi=0, seccomp_error="seccomp unavailable")


@pytest.mark.parametrize(
    ("body", "strong", "error"),
    [
        (STRONG_ROOT, True, False),
        (WEAK, False, False),
        ({"ready": False, "not_ready_because": ["isolation required but not strong"], **{"isolation": WEAK["isolation"]}}, False, False),
        ({"ready": True}, False, True),
        ("pong", False, True),
        ({"isolation": {"strong": "yes"}}, False, True),
    ],
    ids=[
        "a strong report",
        "a weak report",
        "a strict replica's 503 body still says what it has",
        "a body without isolation is no observation",
        "a body that is not an object is no observation",
        "a malformed strong flag is no observation",
    ],
)
def test_readyz_bodies(body: Any, strong: bool, error: bool) -> None:
    report = parse_readyz("p", body)
    assert report.observed is not error
    assert report.strong is strong


def test_summary_keeps_only_layers_every_replica_has_and_names_the_weak_ones() -> None:
    reports = [parse_readyz("b", STRONG_NONROOT), parse_readyz("a", STRONG_ROOT), parse_readyz("c", WEAK), ReplicaIsolation("d", error="refused")]
    summary = summarize(reports)
    assert summary is not None
    assert summary.replicas == 3 and summary.strong is False and summary.weak_replicas == ["c"]
    assert summary.mode == "mixed"
    assert summary.layers == [layer for layer in STRONG_ROOT["isolation"]["layers"] if all(layer in r["isolation"]["layers"] for r in (STRONG_NONROOT, WEAK))]
    assert "memory-watch" in summary.layers and "seccomp" not in summary.layers
    assert summary.problems == WEAK["isolation"]["problems"][:10]  # only the weak replica's problems
    assert summarize([ReplicaIsolation("d", error="refused")]) is None


@pytest.mark.parametrize(
    ("reports", "status", "reason"),
    [
        ([parse_readyz("a", STRONG_ROOT)], True, "StrongIsolation"),
        ([parse_readyz("a", STRONG_ROOT), parse_readyz("b", WEAK)], False, "WeakIsolation"),
        ([ReplicaIsolation("a", error="ClientConnectorError: refused")], None, "ReadyzUnreadable"),
        ([], None, "NotObserved"),
    ],
    ids=["all strong", "one weak replica makes it False", "unreadable replicas leave it Unknown, saying why", "nothing read yet"],
)
def test_condition(reports: list[ReplicaIsolation], status: bool | None, reason: str) -> None:
    seen = IsolationObservation(reports)
    cond = isolation_condition(seen.summary, seen.errors)
    assert (cond.status, cond.reason) == (status, reason)
    if reason == "WeakIsolation":
        assert "b" in cond.message and WEAK["isolation"]["problems"][0][:40] in cond.message
    if reason == "ReadyzUnreadable":
        assert "refused" in cond.message


def pod(
    name: str, *, phase: str = "Running", ip: str | None = "10.0.0.5", running: bool = True, restarts: int = 0, port: int | None = 8080, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    container: dict[str, Any] = {"name": "sandbox"}
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
    state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "sandbox", "state": state, "restartCount": restarts}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"containers": [container]}, "status": status}


@pytest.mark.parametrize(
    ("obj", "url"),
    [
        (pod("a"), "http://10.0.0.5:8080/readyz"),
        (pod("a", port=18080), "http://10.0.0.5:18080/readyz"),
        (pod("a", ip="fd00::5"), "http://[fd00::5]:8080/readyz"),
        (pod("a", phase="Pending"), None),
        (pod("a", ip=None), None),
        (pod("a", running=False), None),
        (pod("a", deleting=True), None),
    ],
    ids=[
        "a running pod on its declared port",
        "another declared port",
        "an IPv6 pod address in brackets",
        "a pending pod is not asked",
        "a pod without an IP is not asked",
        "a container not running yet is not asked",
        "a terminating pod is not asked",
    ],
)
def test_which_pods_are_asked(obj: dict[str, Any], url: str | None) -> None:
    assert [t.url for t in readable_pods([obj])] == ([url] if url else [])


async def test_one_read_per_container_start_and_failed_reads_retried_later() -> None:
    calls: list[str] = []
    answers: dict[str, Any] = {"http://10.0.0.5:8080/readyz": OSError("refused")}
    clock = [100.0]

    async def fetch(_session: Any, url: str) -> Any:
        calls.append(url)
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    reader = IsolationReader(fetch=fetch, now=lambda: clock[0])
    try:
        assert (await reader.read("ml", "demo", [pod("a")]))[0].error == "OSError: refused"
        await reader.read("ml", "demo", [pod("a")])
        assert len(calls) == 1  # a failed read is not repeated on every pass
        clock[0] += 11
        answers["http://10.0.0.5:8080/readyz"] = STRONG_ROOT
        assert (await reader.read("ml", "demo", [pod("a")]))[0].strong is True
        await reader.read("ml", "demo", [pod("a")])
        assert len(calls) == 2  # a successful read holds for this container start
        assert (await reader.read("ml", "demo", [pod("a", restarts=1)]))[0].strong is True
        assert len(calls) == 3  # a restarted container is a new server, read again
        assert await reader.read("ml", "demo", []) == []
    finally:
        await reader.close()


def test_status_shows_isolation_and_keeps_the_last_one_when_scaled_down() -> None:
    run = run_of()
    rl = [StageStatus(name=n, state="Succeeded", attempt=1) for n in ("prepare", "sft", "merge")] + [StageStatus(name="rl", state="Running", attempt=1, job="demo-rl-1")]
    children = {"demo-rl-1": {"status": {"jobDeploymentStatus": "Running"}}}
    seen = IsolationObservation([parse_readyz("demo-sandbox-a", STRONG_ROOT), parse_readyz("demo-sandbox-b", STRONG_ROOT)])
    first = decide(run, RetoolRunStatus(stages=rl), Observed(children=children, sandbox_ready_replicas=2, sandbox_isolation=seen), T0).status
    cond = {x.type: x for x in first.conditions}["SandboxIsolation"]
    assert (cond.status, cond.reason) == ("True", "StrongIsolation")
    assert first.sandbox is not None and first.sandbox.isolation is not None
    assert first.sandbox.isolation.layers == STRONG_ROOT["isolation"]["layers"] and first.sandbox.isolation.replicas == 2
    # No pods any more (rl done, scaled to zero): the status still says what rl ran with.
    later = decide(run, first, Observed(children=children), T0 + dt.timedelta(minutes=5)).status
    assert later.sandbox is not None and later.sandbox.isolation == first.sandbox.isolation
    assert {x.type: x for x in later.conditions}["SandboxIsolation"] == cond
    # A weak replica turns the condition False.
    weak = IsolationObservation([parse_readyz("demo-sandbox-c", WEAK)])
    decision = decide(run, later, Observed(children=children, sandbox_isolation=weak), T0 + dt.timedelta(minutes=6))
    worse = decision.status
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "WeakIsolation")]
    again = decide(run, worse, Observed(children=children, sandbox_isolation=weak), T0 + dt.timedelta(minutes=7))
    assert again.events == [] and again.status == worse  # nothing new: no event, no status write
    cond = {x.type: x for x in worse.conditions}["SandboxIsolation"]
    assert (cond.status, cond.reason) == ("False", "WeakIsolation")
    assert worse.sandbox is not None and worse.sandbox.isolation is not None and worse.sandbox.isolation.weak_replicas == ["demo-sandbox-c"]


def test_a_run_without_a_sandbox_has_no_isolation_condition() -> None:
    status = decide(run_of(recipe="text-only", sft={"enabled": False}), RetoolRunStatus(), Observed(), T0).status
    assert "SandboxIsolation" not in {x.type for x in status.conditions}


def test_a_replica_that_is_root_of_the_node_turns_the_condition_false() -> None:
    """hostUsers: false dropped (feature gate off) or ignored (containerd < 2.0): the replica says so."""
    on_node = readyz_body(euid=0, uid_switch=True, host_userns=True)
    assert on_node["isolation"]["strong"] is True and on_node["isolation"]["root_on_node"] is True
    seen = IsolationObservation([parse_readyz("a", STRONG_ROOT), parse_readyz("b", on_node)])
    summary = seen.summary
    assert summary is not None and summary.strong is True and summary.root_on_node == ["b"]
    cond = isolation_condition(summary, seen.errors)
    assert (cond.status, cond.reason) == (False, "RootOnNode")
    assert "b" in cond.message and "sandboxUserNamespaces" in cond.message
