"""The rendered tool config through verl's tool registry, and the run's sandbox through the tool.

``initialize_tools_from_config`` is what verl's tool agent loop calls in every agent-loop worker:
a class path that does not import, a config the tool rejects or a schema the registry cannot
validate fails there, at the first rollout, on GPUs. (verl's RL dataset swallows the same error
with a warning, so data loading alone does not show it.) The sandbox is then called the way a
rollout calls it: the tool's ``create`` / ``execute`` with a snippet whose output is known.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
from verl.tools.utils.tool_registry import initialize_tools_from_config

from retool.preflight.checks import CheckResult
from retool.preflight.sft import plain
from retool.recipe.tool.config import TOOL_NAME

logger = logging.getLogger(__name__)

PROBE_CODE = "x = 6 * 7\nprint(f'probe {x}')"
PROBE_OUTPUT = "probe 42"


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The schemas verl puts in the prompt (as ``ToolAgentLoop.init_class`` dumps them)."""
    return [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools]


def check_tools(tool_config_path: str, scope: str, sft_tools: list[dict[str, Any]] | None) -> tuple[CheckResult, list[Any]]:
    """``tools``: the registry builds the tools; one is ``code_interpreter``; its schema is the one SFT trained with."""
    try:
        tools = initialize_tools_from_config(tool_config_path)
    except Exception as exc:
        return CheckResult("tools", scope, "failed", f"verl's tool registry could not build the tools of {tool_config_path}: {type(exc).__name__}: {exc}"), []
    names = [tool.name for tool in tools]
    details: dict[str, Any] = {"tool_config": tool_config_path, "tools": names, "classes": [f"{type(t).__module__}.{type(t).__name__}" for t in tools]}
    if TOOL_NAME not in names:
        return CheckResult("tools", scope, "failed", f"the tool config builds {names or 'no tools'}; the recipe's rollouts call {TOOL_NAME!r}", details), tools
    if sft_tools is not None:
        rl = next(s for s in tool_schemas(tools) if s["function"]["name"] == TOOL_NAME)
        sft = next((plain(s) for s in sft_tools if plain(s).get("function", {}).get("name") == TOOL_NAME), None)
        if sft != rl:
            details["sft_schema"], details["rl_schema"] = sft, rl
            return CheckResult("tools", scope, "warning", f"{TOOL_NAME} is described differently in the SFT data than in the RL prompts", details), tools
    return CheckResult("tools", scope, "passed", f"built {', '.join(names)}", details), tools


async def _wait_for_ping(url: str, deadline_s: float) -> str | None:
    """None once ``GET /v1/ping`` answers, else the last error after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    error = "not tried"
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                response = await client.get(f"{url}/v1/ping")
                if response.status_code == 200:
                    return None
                error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                return error
            await asyncio.sleep(1.0)


async def _probe(tool: Any) -> str:
    instance_id, _ = await tool.create()
    try:
        response, _reward, _metrics = await tool.execute(instance_id, {"code": PROBE_CODE})
    finally:
        await tool.release(instance_id)
    return str(response.text or "")


def check_sandbox(tools: Sequence[Any], scope: str, *, wait_s: float) -> CheckResult:
    """``sandbox``: the run's sandbox answers, and running code through the tool prints what it should."""
    tool = next(t for t in tools if t.name == TOOL_NAME)
    url = getattr(getattr(tool, "settings", None), "sandbox_url", None)
    details: dict[str, Any] = {"sandbox_url": url}
    loop = asyncio.new_event_loop()
    try:
        if url:
            error = loop.run_until_complete(_wait_for_ping(url, wait_s))
            if error is not None:
                return CheckResult("sandbox", scope, "failed", f"the sandbox at {url} did not answer /v1/ping within {wait_s:g} s ({error})", details)
        started = time.monotonic()
        text = loop.run_until_complete(_probe(tool))
        details["seconds"] = round(time.monotonic() - started, 3)
        closer = getattr(tool, "aclose", None)
        if closer is not None:
            loop.run_until_complete(closer())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    details["output"] = text[:500]
    if PROBE_OUTPUT not in text:
        return CheckResult("sandbox", scope, "failed", f"running code through {TOOL_NAME} returned {text[:200]!r}, expected {PROBE_OUTPUT!r}", details)
    return CheckResult("sandbox", scope, "passed", f"{TOOL_NAME} ran code in {url or 'the sandbox'} ({details['seconds']} s)", details)
