"""The execution engine alone (no web framework): warm workers, bounded queue, replacement of dead workers."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from retool.sandbox.pool import ExecutionPool, Job, PoolOverloaded, PoolUnavailable
from retool.sandbox.settings import SandboxSettings

pytestmark = pytest.mark.slow


async def test_pool_runs_refuses_replaces_and_closes() -> None:
    pool = ExecutionPool(SandboxSettings(workers=1, queue_size=1))
    await pool.start()
    try:
        result = await pool.run(Job(code="import sympy\nprint(sympy.isprime(97))", run_timeout=5, memory_limit_mb=256))
        assert (result["exit_code"], result["stdout"]) == (0, "True\n")

        # One running, one queued: the third is refused at once.
        sleeper = asyncio.create_task(pool.run(Job(code="import time\ntime.sleep(1.0)\nprint('a')", run_timeout=5, memory_limit_mb=256)))
        await asyncio.sleep(0.2)
        queued = asyncio.create_task(pool.run(Job(code="print('b')", run_timeout=5, memory_limit_mb=256)))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolOverloaded, match="1 requests queued"):
            await pool.run(Job(code="print('c')", run_timeout=5, memory_limit_mb=256))
        assert (await sleeper)["stdout"] == "a\n" and (await queued)["stdout"] == "b\n"

        # The worker dies in the middle of an execution: that request says so, a new worker takes over.
        victim = asyncio.create_task(pool.run(Job(code="import time\ntime.sleep(5)", run_timeout=10, memory_limit_mb=256)))
        await asyncio.sleep(0.3)
        (worker,) = pool._workers.values()
        os.kill(worker.keeper_pid, signal.SIGKILL)
        assert (await victim)["worker_died"] is True
        after = await pool.run(Job(code="print('again')", run_timeout=5, memory_limit_mb=256))
        assert after["stdout"] == "again\n" and pool.snapshot()["worker_restarts"] == 1
    finally:
        await pool.close()
    with pytest.raises(PoolUnavailable, match="shutting down"):
        await pool.run(Job(code="print(1)", run_timeout=1, memory_limit_mb=256))
