"""The ``sandbox`` preflight check: the run's sandbox answers, and code run through the tool prints what it
should. It drives the tool through verl's ``BaseTool`` methods (``create``/``execute``/``release``), the
same on verl 0.6.1 and 0.9.1, so both lines' preflights run it (the tools come from each line's own
registry: :mod:`retool.preflight.tools` on 0.6.1, :mod:`retool.preflight.line09` on 0.9.1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from retool.preflight.checks import CheckResult
from retool.recipe.tool.config import TOOL_NAME

PROBE_CODE = "x = 6 * 7\nprint(f'probe {x}')"
PROBE_OUTPUT = "probe 42"
TEXT_ONLY_SANDBOX = "recipe text-only: no code interpreter, so the run has no sandbox to call"


PING_FIRST_INTERVAL_S = 0.05
PING_MAX_INTERVAL_S = 1.0


async def _wait_for_ping(url: str, deadline_s: float) -> str | None:
    """None once ``GET /v1/ping`` answers, else the last error after ``deadline_s``.

    The pause between tries doubles from 50 ms to 1 s: a sandbox that comes up while the stage
    starts is seen within a few tens of milliseconds, one that takes minutes costs a request a second.
    """
    deadline = time.monotonic() + deadline_s
    error = "not tried"
    interval = PING_FIRST_INTERVAL_S
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                response = await client.get(f"{url}/v1/ping")
                if response.status_code == 200:
                    return None
                error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return error
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, PING_MAX_INTERVAL_S)


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
