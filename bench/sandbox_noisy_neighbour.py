"""The noisy-neighbour figure: a victim's latency while 8 attackers spin, fork, flood and fsync.

    sudo python bench/sandbox_noisy_neighbour.py --duration 20

Our server is started the restricted pod way (tests/sandbox/podlike.py ``pod``, 16 workers). A victim
posts ``print(1+1)`` back to back, first alone for ``--duration`` seconds, then with 8 attackers
(two of each kind, back to back, each run stopped at its 2 s ``run_timeout``): a CPU spinner, a fork
loop (up to ``MAX_PROCESSES``), an output flood (past the output cap) and an fsync loop on a scratch
file. Prints the victim's p50/p99 and count in both phases, each with the load average.
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

ATTACKS = {
    "spin": "while True:\n    pass\n",
    "fork": "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            while True:\n                pass\n    except OSError:\n        pass\n",
    "flood": "import sys\nline = 'x' * 4096 + '\\n'\nwhile True:\n    sys.stdout.write(line)\n",
    "fsync": "import os\nfd = os.open('f', os.O_WRONLY | os.O_CREAT)\nwhile True:\n    os.write(fd, b'x' * 4096)\n    os.fsync(fd)\n",
}


async def victim(client: httpx.AsyncClient, duration: float) -> list[float]:
    latencies = []
    stop_at = time.monotonic() + duration
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        answer = (await client.post("/run_code", json={"code": "print(1+1)", "run_timeout": 10})).json()
        latencies.append(time.perf_counter() - started)
        if (answer.get("run_result") or {}).get("stdout") != "2\n":
            raise SystemExit(f"the victim got a wrong answer: {answer}")
    return latencies


async def attacker(client: httpx.AsyncClient, code: str, stop: asyncio.Event) -> int:
    runs = 0
    while not stop.is_set():
        await client.post("/run_code", json={"code": code, "run_timeout": 2, "memory_limit_MB": 256})
        runs += 1
    return runs


async def measure(url: str, duration: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        await victim(client, 2.0)  # warm-up
        for label, attackers in (("alone", 0), ("8 attackers", 8)):
            stop = asyncio.Event()
            tasks = [asyncio.create_task(attacker(client, code, stop)) for code in list(ATTACKS.values()) * (attackers // len(ATTACKS))]
            load = os.getloadavg()[0]
            latencies = await victim(client, duration)
            stop.set()
            runs = sum(await asyncio.gather(*tasks))
            print(
                f"victim {label:<12} p50 {sandbox_bench.quantile(latencies, 0.5) * 1000:7.1f} ms  p99 {sandbox_bench.quantile(latencies, 0.99) * 1000:7.1f} ms"
                f"  n={len(latencies):<5} attacker runs={runs:<4} load {load:.1f} -> {os.getloadavg()[0]:.1f}",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("the restricted pod way needs root (tests/sandbox/podlike.py)")
    process, url, server = sandbox_bench.start_ours(16, as_pod="pod")
    try:
        asyncio.run(measure(url, args.duration))
    finally:
        sandbox_bench.stop_ours(process, server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
