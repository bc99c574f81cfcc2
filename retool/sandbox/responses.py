"""Turn a worker's result message into the SandboxFusion response (pure, table-tested)."""

from __future__ import annotations

from typing import Any

from retool.sandbox.api import RunCodeResponse, RunResult
from retool.sandbox.outcome import verdict

WORKER_DIED = (
    "the sandbox worker running this code died (the replica may have run out of memory); it has been replaced: retry the call"
)
"""Code cannot reach its worker (see docs/sandbox.md): when one dies mid-execution it is the replica's
trouble (its memory limit, a node problem), so the message says so instead of blaming the code."""


def build_response(result: dict[str, Any], pod_name: str | None) -> RunCodeResponse:
    """SandboxFusion semantics: Success only for exit 0; code failures are Failed, our failures SandboxError."""
    if result.get("sandbox_error"):
        return RunCodeResponse(status="SandboxError", message=f"sandbox failure: {result['sandbox_error']}", executor_pod_name=pod_name)
    if result.get("worker_died"):
        run = RunResult(status="Error", execution_time=result.get("execution_time"), return_code=None, stdout="", stderr=WORKER_DIED + "\n")
        return RunCodeResponse(status="Failed", message=WORKER_DIED, run_result=run, executor_pod_name=pod_name)
    decided = verdict(exit_code=result.get("exit_code"), term_signal=result.get("signal"), timed_out=bool(result.get("timed_out")))
    run = RunResult(
        status=decided.run_status,
        execution_time=result.get("execution_time"),
        cpu_time=result.get("cpu_time"),
        return_code=decided.return_code,
        stdout=result.get("stdout", ""),
        stderr=result.get("stderr", ""),
    )
    # A limit found exceeded only at the end (the scratch quota) fails the run even with exit code 0.
    status = "Failed" if result.get("limit_exceeded") and decided.status == "Success" else decided.status
    return RunCodeResponse(status=status, message="", run_result=run, files=result.get("files") or {}, executor_pod_name=pod_name)
