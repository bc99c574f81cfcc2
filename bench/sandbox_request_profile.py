"""Where one request's time goes: ``print(1+1)`` at c=1, layer by layer.

    sudo python bench/sandbox_request_profile.py --requests 300

Measures, each as a p50 over ``--requests`` sequential calls:

1. HTTP floor: ``GET /v1/ping`` against our server started the restricted pod way (client, uvicorn,
   FastAPI, no sandbox);
2. ``POST /run_code`` on the same server (everything);
3. the pool alone, in this process (``ExecutionPool.run``: no HTTP, no JSON body parse; the replica
   shape this process gets: run as root it is uid-per-execution, not the pod's one uid);
4. inside the worker (from that pool's answers): from sending the job to the execution's exit
   (``ended``: the pre-forked child applies the limits, runs the code, exits), to its reaping by the
   zygote (``reaped``: one round trip), to its output drained (``drained``).

The differences are the costs: 2 - 1 is the sandbox behind HTTP, 2 - 3 the HTTP and body handling of
a run, 3 - drained the pool <-> worker channel and the result's way back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sandbox_bench

from retool.sandbox.api import RunCodeRequest
from retool.sandbox.pool import ExecutionPool
from retool.sandbox.server import job_from_request
from retool.sandbox.settings import SandboxSettings


def p50(values: list[float]) -> float:
    return sandbox_bench.quantile(values, 0.5) * 1000


def http_figures(requests: int) -> dict[str, float]:
    process, url, server = sandbox_bench.start_ours(1, as_pod="pod")
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(20):  # warm-up
                client.post("/run_code", json={"code": "print(1+1)"})
            ping, run = [], []
            for _ in range(requests):
                started = time.perf_counter()
                client.get("/v1/ping")
                ping.append(time.perf_counter() - started)
                started = time.perf_counter()
                answer = client.post("/run_code", json={"code": "print(1+1)"}).json()
                run.append(time.perf_counter() - started)
                assert answer["run_result"]["stdout"] == "2\n", answer
        return {"HTTP floor (GET /v1/ping)": p50(ping), "POST /run_code, restricted pod": p50(run)}
    finally:
        sandbox_bench.stop_ours(process, server)


async def pool_figures(requests: int) -> dict[str, float]:
    settings = SandboxSettings(workers=1)
    pool = ExecutionPool(settings)
    await pool.start()
    try:
        job = job_from_request(RunCodeRequest(code="print(1+1)"), settings)
        for _ in range(20):
            await pool.run(job)
        total: list[float] = []
        phases: dict[str, list[float]] = {}
        for _ in range(requests):
            started = time.perf_counter()
            result = await pool.run(job)
            total.append(time.perf_counter() - started)
            for name, ms in (result.get("phases") or {}).items():
                phases.setdefault(name, []).append(ms / 1000)
        out = {f"pool.run in process ({pool.isolation.get('summary', '')[:60]}...)": p50(total)}
        out.update({f"  worker: job sent -> {name}": p50(values) for name, values in phases.items()})
        return out
    finally:
        await pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("the restricted pod way needs root (tests/sandbox/podlike.py)")
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    figures = http_figures(args.requests)
    figures.update(asyncio.run(pool_figures(args.requests)))
    for name, ms in figures.items():
        print(f"{name:<90} p50 {ms:7.2f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
