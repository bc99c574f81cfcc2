"""Wait for the event a test needs, never for a fixed time.

A sleep of 0.3 s "so the slow request is running" orders nothing on a loaded machine (two cores
shared by the whole suite), where starting an execution can take longer: the test then checks
the wrong thing, or fails. These helpers poll the condition itself, often, and fail naming what
never happened once a generous bound has passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.02
BOUND_S = 30.0


def wait_until(check: Callable[[], object], *, what: str, timeout_s: float = BOUND_S) -> None:
    """Return as soon as ``check()`` is truthy; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(POLL_S)


async def until(check: Callable[[], object], *, what: str, timeout_s: float = BOUND_S) -> None:
    """``wait_until`` for async tests: ``check`` runs in a thread (it may do blocking HTTP), so the
    tasks the test started keep running on the event loop meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}")
        await asyncio.sleep(POLL_S)
