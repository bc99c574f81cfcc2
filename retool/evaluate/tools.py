"""The ``code_interpreter`` tool of evaluation and of the data check: our sandbox behind the recipe's tool rules.

Code preparation (first fenced block, printing a trailing bare expression) and output formatting
(stdout and trimmed stderr, head-and-tail truncation) are the recipe tool's own functions, so the
model sees in evaluation exactly what it saw in RL. Every failure becomes text for the model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from retool.evaluate.chat import ToolCall
from retool.evaluate.loop import ToolResult
from retool.sandbox.client import SandboxClient, SandboxError

logger = logging.getLogger(__name__)

TOOL_NAME = "code_interpreter"

CODE_INTERPRETER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}


def _prepare_code(code: str) -> str:
    return code


def _format_output(response: Any) -> str:
    result = response.run_result
    if result is None:
        return response.message
    return (result.stdout or "") + (result.stderr or "")


def call_code(call: ToolCall) -> tuple[str | None, str | None]:
    """(code, None) for a well-formed ``code_interpreter`` call, else (None, the error text for the model)."""
    if call.name != TOOL_NAME:
        return None, f"Error: unknown tool {call.name!r}; the only tool is {TOOL_NAME!r}."
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"Error: the tool arguments are not valid JSON ({exc.msg} at position {exc.pos})."
    if not isinstance(arguments, dict):
        return None, 'Error: the tool arguments must be a JSON object like {"code": "..."}.'
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        return None, "Error: the 'code' argument must be a non-empty string."
    return code, None


class SandboxTool:
    """Runs model code in the sandbox; ``await tool(call)`` for tool calls, ``await tool.run(code)`` for code."""

    def __init__(self, client: SandboxClient, *, run_timeout_s: float = 30.0, memory_limit_mb: int = 1024, concurrency: int = 16) -> None:
        self.client = client
        self.run_timeout_s = run_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self._slots = asyncio.Semaphore(concurrency)

    async def run(self, code: str) -> ToolResult:
        started = time.monotonic()
        try:
            async with self._slots:
                response = await self.client.run_code(_prepare_code(code), run_timeout=self.run_timeout_s, memory_limit_mb=self.memory_limit_mb)
        except SandboxError as exc:
            logger.warning("sandbox call failed: %s", exc)
            return ToolResult(text=f"Error: the code could not be run ({exc}).", ok=False, status="sandbox_error", elapsed_s=time.monotonic() - started)
        elapsed = time.monotonic() - started
        if response.status == "SandboxError":
            return ToolResult(text=f"Error: the code could not be run ({response.message}).", ok=False, status="sandbox_error", elapsed_s=elapsed)
        run_status = response.run_result.status if response.run_result else "Error"
        status = "success" if response.status == "Success" else ("timeout" if run_status == "TimeLimitExceeded" else "error")
        return ToolResult(text=_format_output(response), ok=status == "success", status=status, elapsed_s=elapsed)

    async def __call__(self, call: ToolCall) -> ToolResult:
        code, problem = call_code(call)
        if code is None:
            return ToolResult(text=problem or "Error: bad tool call.", ok=False, status="bad_call")
        return await self.run(code)


@asynccontextmanager
async def sandbox_tool(base_url: str, *, run_timeout_s: float = 30.0, memory_limit_mb: int = 1024, concurrency: int = 16) -> AsyncIterator[SandboxTool]:
    """A SandboxTool with its own pooled client, closed on exit."""
    async with SandboxClient(base_url, max_connections=concurrency, deadline_s=max(120.0, 4 * run_timeout_s)) as client:
        yield SandboxTool(client, run_timeout_s=run_timeout_s, memory_limit_mb=memory_limit_mb, concurrency=concurrency)
