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
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from retool.recipe.tool.config import TOOL_CLASS, TOOL_NAME, TOOL_SCHEMA, CodeInterpreterConfig, render_tool_config  # noqa: F401  (re-exported)
from retool.recipe.tool.interpreter import describe_response, describe_sandbox_failure, extract_code, print_trailing_expression, truncate_middle
from retool.sandbox.client import SandboxClient, SandboxError, sandbox_failure_status

logger = logging.getLogger(__name__)

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
        except SandboxError as exc:
            status = sandbox_failure_status(exc)
            logger.warning("sandbox call failed (%s): %s", status, exc)
            return describe_sandbox_failure(status, str(exc), deadline_s=settings.retry_deadline_s), status
        return describe_response(
            response,
            original=original,
            code=code,
            timeout_s=settings.timeout_s,
            memory_limit_mb=settings.memory_limit_mb,
            max_output_chars=settings.max_output_chars,
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None

    async def aclose(self) -> None:
        """Close the HTTP pool (tests, and workers that shut down cleanly)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
