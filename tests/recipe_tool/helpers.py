"""What the tool tests share: running a coroutine against a tool and closing its client afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from retool.recipe.verl_plugins.tool import CodeInterpreterTool

T = TypeVar("T")


def run_then_close(tool: CodeInterpreterTool, work: Callable[[CodeInterpreterTool], Awaitable[T]]) -> T:
    """``work(tool)`` in a fresh event loop; the tool's HTTP client is closed after it, whatever happened."""

    async def go() -> T:
        try:
            return await work(tool)
        finally:
            await tool.aclose()

    return asyncio.run(go())
