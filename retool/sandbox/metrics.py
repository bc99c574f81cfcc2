"""Prometheus metrics of a sandbox replica (own registry, so tests and several apps do not collide)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class SandboxMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("retool_sandbox_requests", "Answered /run_code requests by status (Success, Failed, SandboxError, Rejected).", ["status"], registry=r)
        self.latency = Histogram("retool_sandbox_request_seconds", "Latency of /run_code, queueing included.", buckets=LATENCY_BUCKETS, registry=r)
        self.execution = Histogram("retool_sandbox_execution_seconds", "Wall time of executions.", buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("retool_sandbox_queue_depth", "Requests waiting for a worker.", registry=r)
        self.busy_workers = Gauge("retool_sandbox_busy_workers", "Workers running an execution.", registry=r)
        self.live_workers = Gauge("retool_sandbox_live_workers", "Workers alive (idle or busy).", registry=r)
        self.worker_restarts = Counter("retool_sandbox_worker_restarts", "Workers replaced after dying or hanging.", registry=r)
        self.timeouts = Counter("retool_sandbox_timeouts", "Executions killed at their run_timeout.", registry=r)
        self.memory_kills = Counter("retool_sandbox_memory_kills", "Executions stopped by their memory limit.", registry=r)
        self.rejected = Counter("retool_sandbox_rejected", "Requests refused with 429 because the queue was full.", registry=r)
        self.truncated = Counter("retool_sandbox_output_truncated", "Executions whose output went over the cap.", registry=r)
        self.limit_kills = Counter("retool_sandbox_limit_kills", "Executions ended because all their processes together went over a limit.", ["limit"], registry=r)
        self.http_rejected = Counter("retool_sandbox_http_rejected", "HTTP requests or connections refused before reaching the sandbox, by reason.", ["reason"], registry=r)
        self.cgroup_failures = Counter(
            "retool_sandbox_cgroup_failures",
            "Executions whose own cgroup could not be made on a replica with the cgroup layer, by what happened (refused, ran).",
            ["outcome"],
            registry=r,
        )
        self.isolation_layer = Gauge("retool_sandbox_isolation_layer", "1 for each isolation layer in force on this replica.", ["layer"], registry=r)
        self.isolation_guard = Gauge("retool_sandbox_isolation_guarded", "1 when some layer closes this way out of an execution, else 0.", ["way"], registry=r)
        self.isolation_strong = Gauge("retool_sandbox_isolation_strong", "1 when every way out of an execution is closed by a kernel-enforced layer.", registry=r)
        self.landlock_abi = Gauge("retool_sandbox_landlock_abi", "Landlock ABI in use (0: none).", registry=r)

    def publish_isolation(self, isolation: dict[str, Any]) -> None:
        for layer in isolation["layers"]:
            self.isolation_layer.labels(layer).set(1)
        for way, layers in isolation["guards"].items():
            self.isolation_guard.labels(way).set(1 if layers else 0)
        self.isolation_strong.set(1 if isolation["strong"] else 0)
        self.landlock_abi.set(isolation["landlock_abi_used"])
