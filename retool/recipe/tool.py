"""The ``code_interpreter`` tool for verl 0.6.1's tool agent loop, backed by our sandbox client.

verl builds the tool from the YAML at ``actor_rollout_ref.rollout.multi_turn.tool_config_path``
(``verl.tools.utils.tool_registry.initialize_tools_from_config``) once per agent-loop worker
process, then for every call runs ``create`` -> ``execute`` -> ``release``. This class is written
against that interface directly rather than on verl's SandboxFusionTool (later verl releases
removed it, and it returns ``None`` on some failures, which crashes the loop).

Every failure is text for the model: bad arguments, an unreachable or overloaded sandbox, a
timeout, a crash. ``execute`` never raises and never returns ``None``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal
from urllib.parse import urlsplit
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from retool.recipe.interpreter import extract_code, format_run, print_trailing_expression, restore_source_in_traceback, truncate_middle
from retool.sandbox.client import SandboxClient, SandboxError, SandboxOverloaded, SandboxUnavailable

logger = logging.getLogger(__name__)

TOOL_NAME = "code_interpreter"
TOOL_CLASS = f"{__name__}.CodeInterpreterTool"

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run Python code in a sandbox and return its stdout and stderr. The value of a trailing bare "
            "expression is printed. numpy, sympy and scipy are available; there is no network access."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


class CodeInterpreterConfig(BaseModel):
    """The tool's ``config`` block in the tool-config YAML; unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["native"] = Field("native", description="verl's tool type; this tool is a native one.")
    sandbox_url: str = Field(..., description="Base URL of the sandbox (SandboxFusion API: POST /run_code).")
    timeout_s: float = Field(30.0, gt=0, le=3600, description="Wall-clock limit of one code execution, seconds.")
    memory_limit_mb: int = Field(1024, ge=16, le=1 << 20, description="Memory limit of one code execution, MiB.")
    max_output_chars: int = Field(4096, ge=200, description="Longest text returned to the model; head and tail are kept around a marker.")
    concurrency: int = Field(16, ge=1, le=4096, description="Executions in flight at once from one agent-loop worker process.")
    retry_deadline_s: float = Field(
        120.0, gt=0, description="Total time one call may spend on the sandbox including retries of 429/503 and connection errors, seconds."
    )

    @field_validator("sandbox_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"sandbox_url must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _deadline_covers_a_run(self) -> CodeInterpreterConfig:
        if self.retry_deadline_s <= self.timeout_s:
            raise ValueError(f"retry_deadline_s ({self.retry_deadline_s:g}) must exceed timeout_s ({self.timeout_s:g}): one run must fit in it")
        return self


def render_tool_config(*, sandbox_url: str, timeout_s: float, memory_limit_mb: int, max_output_chars: int, concurrency: int) -> dict[str, Any]:
    """The whole tool-config document verl's ``tool_config_path`` points at (validated, YAML-able).

    Raises pydantic.ValidationError naming the bad field. The retry deadline is four runs, at least
    two minutes: long enough to ride out a sandbox replica restart.
    """
    config = CodeInterpreterConfig(
        sandbox_url=sandbox_url,
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        max_output_chars=max_output_chars,
        concurrency=concurrency,
        retry_deadline_s=max(120.0, 4 * timeout_s),
    )
    return {"tools": [{"class_name": TOOL_CLASS, "config": config.model_dump(), "tool_schema": TOOL_SCHEMA}]}


def argument_error(parameters: Any) -> str | None:
    """Why ``parameters`` is not ``{"code": <non-empty str>}``, as a message for the model; None if it is."""
    if not isinstance(parameters, dict):
        return f'Tool error: the arguments must be a JSON object like {{"code": "print(1 + 1)"}}, got {type(parameters).__name__}.'
    if "code" not in parameters:
        return 'Tool error: missing the required argument "code" (the Python code to run).'
    code = parameters["code"]
    if not isinstance(code, str):
        return f'Tool error: the argument "code" must be a string, got {type(code).__name__}.'
    if not code.strip():
        return 'Tool error: the argument "code" is empty.'
    return None


class CodeInterpreterTool(BaseTool):
    """verl tool: run the model's Python in our sandbox and return what it printed.

    The sandbox client and the concurrency semaphore belong to an event loop, and verl builds the
    tool outside one (in its class-level agent-loop setup), so both are created on first use in the
    running loop.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        self.settings = CodeInterpreterConfig.model_validate(config)
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: SandboxClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _resources(self) -> tuple[SandboxClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._semaphore is None:
            self._loop = loop
            self._client = SandboxClient(self.settings.sandbox_url, max_connections=self.settings.concurrency, deadline_s=self.settings.retry_deadline_s)
            self._semaphore = asyncio.Semaphore(self.settings.concurrency)
        return self._client, self._semaphore

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Run ``parameters["code"]``; returns (text for the model, step reward 0.0, metrics)."""
        started = time.monotonic()
        outcome = "ok"
        try:
            problem = argument_error(parameters)
            if problem is not None:
                outcome = "bad_arguments"
                text = problem
            else:
                text, outcome = await self._run(parameters["code"])
        except Exception as exc:  # the agent loop must never see an exception from this tool
            logger.exception("code_interpreter failed unexpectedly")
            outcome = "tool_error"
            text = f"Tool error: {type(exc).__name__}: {exc}"
        text = truncate_middle(text, self.settings.max_output_chars) if text else "(no output)"
        return ToolResponse(text=text), 0.0, {"outcome": outcome, "seconds": round(time.monotonic() - started, 4)}

    async def _run(self, argument: str) -> tuple[str, str]:
        original = extract_code(argument)
        code = print_trailing_expression(original)
        client, semaphore = self._resources()
        settings = self.settings
        try:
            async with semaphore:
                response = await client.run_code(code, run_timeout=settings.timeout_s, memory_limit_mb=settings.memory_limit_mb)
        except SandboxOverloaded as exc:
            logger.warning("sandbox overloaded: %s", exc)
            return f"Sandbox error: the code interpreter is overloaded and did not run the code within {settings.retry_deadline_s:g} s; try again.", "overloaded"
        except SandboxUnavailable as exc:
            logger.warning("sandbox unavailable: %s", exc)
            return f"Sandbox error: the code interpreter is unreachable and did not run the code within {settings.retry_deadline_s:g} s; try again.", "unavailable"
        except SandboxError as exc:
            logger.warning("sandbox refused the request: %s", exc)
            return f"Sandbox error: {exc}", "sandbox_error"
        run = response.run_result
        text = format_run(
            status=response.status,
            run_status=run.status if run else None,
            stdout=(run.stdout or "") if run else "",
            stderr=restore_source_in_traceback(run.stderr or "", original, code) if run else "",
            return_code=run.return_code if run else None,
            message=response.message,
            timeout_s=settings.timeout_s,
            memory_limit_mb=settings.memory_limit_mb,
            max_output_chars=settings.max_output_chars,
        )
        outcome = {"Success": "ok", "Failed": "code_failed"}.get(response.status, "sandbox_error")
        if run is not None and run.status == "TimeLimitExceeded":
            outcome = "timeout"
        return text, outcome

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None

    async def aclose(self) -> None:
        """Close the HTTP pool (tests, and workers that shut down cleanly)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
