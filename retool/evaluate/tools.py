"""The ``code_interpreter`` tool of evaluation and of the data check: our sandbox behind the recipe's tool rules.

Code preparation (first fenced block, printing a trailing bare expression) and output formatting
(stdout and trimmed traceback, time-outs and kills explained, head-and-tail truncation) are the
recipe tool's own pure functions (``retool.recipe.tool.interpreter``), and the schema offered to the
model is the one in the RL tool config, so the model sees in evaluation exactly what it saw in
RL. Every failure becomes text for the model. (The verl tool class itself is not used: importing
verl costs seconds and nothing here needs it.)
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import yaml

from retool.evaluate.chat import ToolCall
from retool.evaluate.loop import ToolResult
from retool.recipe.tool.interpreter import describe_response, describe_sandbox_failure, extract_code, print_trailing_expression, truncate_middle
from retool.sandbox.client import SandboxClient, SandboxError, sandbox_failure_status

logger = logging.getLogger(__name__)

TOOL_NAME = "code_interpreter"
DEFAULT_MAX_OUTPUT_CHARS = 4096
"""The RL tool config's default (``max_output_chars``)."""


@functools.cache
def _training_tool_schema() -> dict[str, Any]:
    document = yaml.safe_load(resources.files("retool.recipe.tool").joinpath("tool_config.yaml").read_text())
    return document["tools"][0]["tool_schema"]


def training_tool_schema() -> dict[str, Any]:
    """The ``code_interpreter`` function schema of the RL tool config (a fresh copy)."""
    return json.loads(json.dumps(_training_tool_schema()))


def call_code(call: ToolCall) -> tuple[str | None, str | None]:
    """(code, None) for a well-formed ``code_interpreter`` call, else (None, the error text for the model)."""
    if call.name != TOOL_NAME:
        return None, f"Tool error: unknown tool {call.name!r}; the only tool is {TOOL_NAME!r}."
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"Tool error: the arguments are not valid JSON ({exc.msg} at position {exc.pos}); send {{\"code\": \"...\"}}."
    if not isinstance(arguments, dict):
        return None, 'Tool error: the arguments must be a JSON object like {"code": "print(1 + 1)"}.'
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        return None, 'Tool error: the argument "code" must be a non-empty string (the Python code to run).'
    return code, None


class SandboxTool:
    """Runs model code in the sandbox; ``await tool(call)`` for tool calls, ``await tool.run(code)`` for code."""

    def __init__(
        self,
        client: SandboxClient,
        *,
        run_timeout_s: float = 30.0,
        memory_limit_mb: int = 1024,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        concurrency: int = 16,
    ) -> None:
        self.client = client
        self.run_timeout_s = run_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.max_output_chars = max_output_chars
        self._slots = asyncio.Semaphore(concurrency)

    async def run(self, argument: str) -> ToolResult:
        """Run the code in ``argument`` (fenced or not) as the RL tool does; ``status`` is the tool's outcome name."""
        started = time.monotonic()
        original = extract_code(argument)
        code = print_trailing_expression(original)
        try:
            async with self._slots:
                response = await self.client.run_code(code, run_timeout=self.run_timeout_s, memory_limit_mb=self.memory_limit_mb)
        except SandboxError as exc:
            status = sandbox_failure_status(exc)
            logger.warning("sandbox call failed (%s): %s", status, exc)
            text = describe_sandbox_failure(status, str(exc), deadline_s=self.client.deadline_s)
            return ToolResult(text=text, ok=False, status=status, elapsed_s=time.monotonic() - started)
        text, status = describe_response(
            response,
            original=original,
            code=code,
            timeout_s=self.run_timeout_s,
            memory_limit_mb=self.memory_limit_mb,
            max_output_chars=self.max_output_chars,
        )
        return ToolResult(text=text, ok=status == "ok", status=status, elapsed_s=time.monotonic() - started)

    async def __call__(self, call: ToolCall) -> ToolResult:
        code, problem = call_code(call)
        if code is None:
            return ToolResult(text=truncate_middle(problem or "Tool error: bad call.", self.max_output_chars), ok=False, status="bad_arguments")
        return await self.run(code)


@asynccontextmanager
async def sandbox_tool(
    base_url: str, *, run_timeout_s: float = 30.0, memory_limit_mb: int = 1024, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, concurrency: int = 16
) -> AsyncIterator[SandboxTool]:
    """A SandboxTool with its own pooled client (the RL tool's retry deadline: four runs, at least 2 min), closed on exit."""
    async with SandboxClient(base_url, max_connections=concurrency, deadline_s=max(120.0, 4 * run_timeout_s)) as client:
        yield SandboxTool(client, run_timeout_s=run_timeout_s, memory_limit_mb=memory_limit_mb, max_output_chars=max_output_chars, concurrency=concurrency)
