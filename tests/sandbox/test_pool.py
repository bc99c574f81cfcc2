"""The execution engine alone (no web framework): warm workers, bounded queue, replacement of dead workers."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from retool.sandbox import protocol
from retool.sandbox.pool import ExecutionPool, Job, JobTooLarge, PoolOverloaded, PoolUnavailable, restart_delay
from retool.sandbox.settings import SandboxSettings
from tests.sandbox.waiting import until

pytestmark = pytest.mark.slow


async def test_pool_runs_refuses_replaces_and_closes() -> None:
    pool = ExecutionPool(SandboxSettings(workers=1, queue_size=1))
    await pool.start()
    try:
        result = await pool.run(Job(code="import sympy\nprint(sympy.isprime(97))", run_timeout=5, memory_limit_mb=256))
        assert (result["exit_code"], result["stdout"]) == (0, "True\n")

        # One running, one queued: the third is refused at once.
        sleeper = asyncio.create_task(pool.run(Job(code="import time\ntime.sleep(1.0)\nprint('a')", run_timeout=5, memory_limit_mb=256)))
        await until(lambda: pool.snapshot()["busy_workers"] == 1, what="the first job running")
        queued = asyncio.create_task(pool.run(Job(code="print('b')", run_timeout=5, memory_limit_mb=256)))
        await until(lambda: pool.snapshot()["queue_depth"] == 1, what="the second job queued")
        with pytest.raises(PoolOverloaded, match="1 requests queued"):
            await pool.run(Job(code="print('c')", run_timeout=5, memory_limit_mb=256))
        assert (await sleeper)["stdout"] == "a\n" and (await queued)["stdout"] == "b\n"

        # The worker dies in the middle of an execution: that request says so, a new worker takes over.
        victim = asyncio.create_task(pool.run(Job(code="import time\ntime.sleep(5)", run_timeout=10, memory_limit_mb=256)))
        await until(lambda: pool.snapshot()["busy_workers"] == 1, what="the victim running")
        (worker,) = pool._workers.values()
        os.kill(worker.keeper_pid, signal.SIGKILL)
        assert (await victim)["worker_died"] is True
        after = await pool.run(Job(code="print('again')", run_timeout=5, memory_limit_mb=256))
        assert after["stdout"] == "again\n" and pool.snapshot()["worker_restarts"] == 1
    finally:
        await pool.close()
    with pytest.raises(PoolUnavailable, match="shutting down"):
        await pool.run(Job(code="print(1)", run_timeout=1, memory_limit_mb=256))


async def test_a_slot_that_keeps_failing_backs_off_and_oversized_jobs_cost_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that cannot apply the plan dies at once: its slot is retried with growing delays,
    never in a tight loop, while the other slot keeps serving. A job too big for the worker channel
    is refused as such, and no worker is lost for it."""
    pool = ExecutionPool(SandboxSettings(workers=2, namespaces="off"))
    await pool.start()
    try:
        monkeypatch.setattr(protocol, "MAX_MESSAGE", 4096)
        with pytest.raises(JobTooLarge, match="over the 4096 a worker accepts"):
            await pool.run(Job(code="x = 1\n" * 2000, run_timeout=5, memory_limit_mb=256))
        monkeypatch.undo()
        assert pool.snapshot()["worker_restarts"] == 0

        # Slot 0's workers die as soon as they are up (as a worker that cannot run would).
        async def kill_slot_0() -> None:
            while True:
                worker = pool._workers.get(0)
                if worker is not None:
                    os.kill(worker.keeper_pid, signal.SIGKILL)
                await asyncio.sleep(0.01)

        killer = asyncio.create_task(kill_slot_0())
        loop = asyncio.get_running_loop()
        start = loop.time()
        # At least 2 s, and until the slot has been replaced 3 times (a loaded machine starts workers slowly).
        while (loop.time() - start < 2.0 or pool.snapshot()["worker_restarts"] < 3) and loop.time() - start < 30:
            await asyncio.sleep(0.05)
        killer.cancel()
        elapsed = loop.time() - start
        restarts = pool.snapshot()["worker_restarts"]
        assert restarts >= 3, f"{restarts} restarts of one slot in {elapsed:.1f} s"
        # Never a tight loop: that many replacements take at least their growing delays.
        backoff = sum(restart_delay(k) for k in range(1, restarts))
        assert backoff <= elapsed, f"{restarts} restarts in {elapsed:.2f} s, less than their backoff ({backoff:.2f} s)"
        result = await pool.run(Job(code="print('other slot')", run_timeout=5, memory_limit_mb=256))
        assert result["stdout"] == "other slot\n"

        # A slot whose worker cannot even apply the plan fails before saying hello: backed off too.
        real_root = pool._tmp_root
        pool._tmp_root = "/nonexistent/scratch"
        os.kill(pool._workers[1].keeper_pid, signal.SIGKILL)
        start = loop.time()
        while (loop.time() - start < 0.5 or pool._failures[1] < 2) and loop.time() - start < 30:
            await asyncio.sleep(0.05)
        elapsed, failures = loop.time() - start, pool._failures[1]
        assert failures >= 2 and sum(restart_delay(k) for k in range(1, failures)) <= elapsed, f"{failures} failures in {elapsed:.2f} s"
        pool._tmp_root = real_root
        deadline = asyncio.get_running_loop().time() + 35
        while len(pool._workers) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert len(pool._workers) == 2, "the slots did not recover"
    finally:
        await pool.close()


async def test_a_job_that_cannot_be_dispatched_gives_its_worker_back() -> None:
    """The replica's process count is made when a worker is taken for the job (``Plan.replica_counts_processes``):
    if it fails, nothing was sent, and the one worker must serve the next job."""

    class BrokenCount:
        def count(self, max_age_s: float = 0.0) -> int:
            raise OSError("/proc could not be listed")

    pool = ExecutionPool(SandboxSettings(workers=1, namespaces="off"))
    await pool.start()
    try:
        pool._uid_processes = BrokenCount()  # type: ignore[assignment]
        with pytest.raises(OSError, match="could not be listed"):
            await pool.run(Job(code="print(1)", run_timeout=5, memory_limit_mb=256))
        pool._uid_processes = None
        result = await asyncio.wait_for(pool.run(Job(code="print(2)", run_timeout=5, memory_limit_mb=256)), timeout=30)
        assert result["stdout"] == "2\n" and pool.snapshot()["busy_workers"] == 0
    finally:
        await pool.close()
