"""Prometheus metrics of a sandbox replica (own registry, so tests and several apps do not collide)."""

from __future__ import annotations

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
