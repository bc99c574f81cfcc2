"""HTTP models of the SandboxFusion ``/run_code`` API, so stock SandboxFusion clients work unchanged.

Field names (including the odd ``memory_limit_MB``) and status strings are SandboxFusion's. Only
python is executed; other languages are accepted by the model and refused by the server with a
clear message, exactly where a SandboxFusion deployment without that runtime would fail.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RunStatus = Literal["Success", "Failed", "SandboxError"]
"""Whole-request outcome: Success (exit 0), Failed (the code failed or timed out), SandboxError (our fault)."""

CommandStatus = Literal["Finished", "Error", "TimeLimitExceeded"]
"""One command's outcome: Finished (exit 0), Error (non-zero exit or signal), TimeLimitExceeded."""


class RunCodeRequest(BaseModel):
    """Body of ``POST /run_code``. Unknown fields are ignored, as SandboxFusion does."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(..., description="Source code to run.")
    language: str = Field("python", description="Only 'python' is served.")
    compile_timeout: float = Field(10.0, ge=0, allow_inf_nan=False, description="Accepted for compatibility; python has no compile step.")
    run_timeout: float = Field(10.0, gt=0, allow_inf_nan=False, description="Wall-clock limit of the run, seconds.")
    memory_limit_MB: int | None = Field(None, description="Memory the code may allocate, MiB; -1 or absent means the server default.")
    stdin: str | None = Field(None, description="Standard input of the program.")
    files: dict[str, str | None] = Field(default_factory=dict, description="Files to create before the run: relative path -> base64 content.")
    fetch_files: list[str] = Field(default_factory=list, description="Relative paths to return (base64) after the run.")


class RunResult(BaseModel):
    """SandboxFusion's ``CommandRunResult``: the outcome of running (or compiling) the program."""

    status: CommandStatus
    execution_time: float | None = Field(None, description="Wall-clock seconds.")
    cpu_time: float | None = Field(None, description="User + system CPU seconds of the program and its children.")
    return_code: int | None = Field(None, description="Exit code; negative signal number when killed by a signal.")
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """Body answered by ``POST /run_code`` (also for refused requests, with status SandboxError)."""

    status: RunStatus
    message: str = ""
    compile_result: RunResult | None = None
    run_result: RunResult | None = None
    files: dict[str, str] = Field(default_factory=dict, description="Fetched files: path -> base64 content.")
    executor_pod_name: str | None = None
