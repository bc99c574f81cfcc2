"""The sandbox's isolation as the run's status shows it: what each replica's /readyz says, summed up.

Pure (no I/O): the runner reads ``GET /readyz`` of every sandbox pod once per container start
(a replica decides its isolation plan once, at start, so one answer holds until it restarts) and
hands the parsed reports here. Reading the replica itself, rather than inferring from the pod spec,
is the point: whether ``hostUsers: false`` took effect, which Landlock ABI the node's kernel has,
whether a RuntimeClass's kernel implements a layer, only the replica can tell.

How the operator gets there: the operator's own pods are admitted on the sandbox port by the
run's sandbox NetworkPolicy (``builders.sandbox.build_sandbox_network_policy``, from the chart's
``RETOOL_OPERATOR_OWN_*`` settings); it connects to each pod's IP directly. No API-server proxy
(``pods/proxy`` would let the operator reach any pod, and API-server traffic is not admitted by
pod-selector NetworkPolicies on most CNIs) and no new RBAC: listing pods is already granted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from retool.spec.status import SandboxIsolationStatus
from retool_operator import constants as c

MAX_LISTED = 10
MAX_TEXT = 300
READYZ_MAX_BYTES = 256 * 1024
"""A /readyz body is a few KiB; anything bigger is not a sandbox answering."""


@dataclass(frozen=True)
class ReplicaIsolation:
    """One replica's ``isolation`` object of /readyz, or why it could not be read."""

    pod: str
    strong: bool = False
    mode: str | None = None
    layers: tuple[str, ...] = ()
    runtime_class: str | None = None
    problems: tuple[str, ...] = ()
    root_on_node: bool = False
    """The server is root of the node's user namespace: the pod's ``hostUsers: false`` did not take effect."""
    error: str | None = None
    """Set when /readyz could not be read or made no sense (the replica then counts as unobserved)."""

    @property
    def observed(self) -> bool:
        return self.error is None


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v)[:MAX_TEXT] for v in value) if isinstance(value, list) else ()


def parse_readyz(pod: str, body: Any) -> ReplicaIsolation:
    """The replica's report from a /readyz body (200 or 503: a strict replica that is not strong
    answers 503 and still says why)."""
    isolation = body.get("isolation") if isinstance(body, dict) else None
    if not isinstance(isolation, dict) or not isinstance(isolation.get("strong"), bool):
        return ReplicaIsolation(pod, error="/readyz has no isolation report (not a retool sandbox, or one too old to report it)")
    mode = isolation.get("mode")
    runtime_class = isolation.get("runtime_class")
    return ReplicaIsolation(
        pod=pod,
        strong=isolation["strong"],
        mode=str(mode)[:64] if mode is not None else None,
        layers=_strings(isolation.get("layers")),
        runtime_class=str(runtime_class)[:253] if runtime_class else None,
        problems=_strings(isolation.get("problems")),
        root_on_node=isolation.get("root_on_node") is True,
    )


def _distinct(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))[:MAX_LISTED]


def summarize(reports: list[ReplicaIsolation]) -> SandboxIsolationStatus | None:
    """status.sandbox.isolation from the replicas read (None when none could be read)."""
    seen = sorted((r for r in reports if r.observed), key=lambda r: r.pod)
    if not seen:
        return None
    modes = {r.mode for r in seen}
    common = [layer for layer in seen[0].layers if all(layer in r.layers for r in seen[1:])]
    runtime_classes = {r.runtime_class for r in seen}
    return SandboxIsolationStatus(
        strong=all(r.strong for r in seen),
        mode=modes.pop() if len(modes) == 1 else "mixed",
        layers=common,
        runtime_class=runtime_classes.pop() if len(runtime_classes) == 1 else None,
        replicas=len(seen),
        weak_replicas=[r.pod for r in seen if not r.strong][:MAX_LISTED],
        root_on_node=[r.pod for r in seen if r.root_on_node][:MAX_LISTED],
        problems=_distinct([p for r in seen if not r.strong for p in r.problems] or [p for r in seen for p in r.problems]),
    )


@dataclass(frozen=True)
class IsolationCondition:
    status: bool | None
    """True, False, or None for Unknown."""
    reason: str
    message: str


@dataclass(frozen=True)
class IsolationObservation:
    """What one pass saw of the sandbox's isolation."""

    reports: list[ReplicaIsolation] = field(default_factory=list)

    @property
    def summary(self) -> SandboxIsolationStatus | None:
        return summarize(self.reports)

    @property
    def errors(self) -> list[str]:
        return [f"{r.pod}: {r.error}" for r in self.reports if r.error]


def isolation_condition(summary: SandboxIsolationStatus | None, errors: list[str]) -> IsolationCondition:
    """The SandboxIsolation condition: True when every replica read is strong, False naming the weak
    ones and what they lack, Unknown while no replica could be read (with why, when a read failed)."""
    if summary is None:
        if errors:
            return IsolationCondition(None, c.REASON_ISOLATION_UNREADABLE, "could not read the replicas' /readyz: " + "; ".join(errors[:3]))
        return IsolationCondition(None, c.REASON_ISOLATION_NOT_OBSERVED, "no sandbox replica has reported its isolation yet")
    where = f" under RuntimeClass {summary.runtime_class}" if summary.runtime_class else ""
    if summary.strong and summary.root_on_node:
        text = (
            f"executions are strongly isolated{where}, but on {', '.join(summary.root_on_node)} the server is root of the node:"
            " hostUsers: false did not take effect (UserNamespacesSupport off, or a runtime without user namespaces);"
            " set the chart's defaults.sandboxUserNamespaces.enabled=false or fix the nodes"
        )
        return IsolationCondition(False, c.REASON_ISOLATION_ROOT_ON_NODE, text)
    if summary.strong:
        text = f"{summary.replicas} replica{'s' if summary.replicas != 1 else ''} strong{where} (mode {summary.mode}): {', '.join(summary.layers)}"
        return IsolationCondition(True, c.REASON_ISOLATION_STRONG, text)
    weak = ", ".join(summary.weak_replicas)
    text = f"not every replica is strongly isolated{where} (of {summary.replicas} read, weak: {weak}): {'; '.join(summary.problems)}"
    return IsolationCondition(False, c.REASON_ISOLATION_WEAK, text[:2000])
