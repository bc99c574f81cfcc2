"""Load generator for SandboxFusion-compatible sandboxes (ours or SandboxFusion itself).

Closed loop: ``c`` concurrent callers send ReTool-typical tool calls back to back for a few seconds;
every answer is checked (status and output), so a fast wrong answer counts as wrong, not fast.

    python bench/sandbox_bench.py --start-ours                 # start our server on a free port
    python bench/sandbox_bench.py --start-ours --as-pod pod    # as a restricted pod runs it (root needed)
    python bench/sandbox_bench.py --url http://127.0.0.1:8080  # any SandboxFusion-compatible server
    options: --concurrency 1,4,16,64 --workloads print,mix --duration 3 --json out.json
             --code-root <checkout of another commit> --env RETOOL_SANDBOX_LANDLOCK_MAX_ABI=0

Prints one row per (workload, concurrency): requests/s, p50/p90/p99 latency, errors, wrong answers,
and for the adversarial mix the latency of its normal requests alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]

LOOP_CODE = "count = 0\nfor a in range(1, 900):\n    for b in range(a, 900):\n        if (a * a + b * b) % 7 == 1:\n            count += 1\nprint(count)\n"


@dataclass(frozen=True)
class Call:
    name: str
    code: str
    expect_status: str  # run_result.status (SandboxFusion: Finished for any exit, TimeLimitExceeded)
    expect_stdout: str | None = None  # exact stdout, computed locally for deterministic code
    expect_stderr: str | None = None  # substring
    run_timeout: float = 10.0
    memory_mb: int = 512
    adversarial: bool = False


def local_stdout(code: str) -> str:
    """What trusted code prints, computed in this process: the reference every answer is checked against."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<bench>", "exec"), {"__name__": "__main__"})
    return buffer.getvalue()


def build_calls() -> dict[str, Call]:
    sources = {
        "print": "print(1+1)\n",
        "comb": "import math\nprint(math.comb(30, 12), math.comb(100, 50) % 1000007)\n",
        "sympy": "import sympy as sp\nx = sp.symbols('x')\nprint(sorted(sp.solve(x**3 - 6*x**2 + 11*x - 6, x)))\n",
        "numpy": (
            "import numpy as np\na = np.array([[3., 1., 0.], [1., 2., 1.], [0., 1., 4.]])\n"
            "print(np.round(np.linalg.solve(a, np.array([4., 8., 13.])), 6).tolist(), round(float(np.linalg.det(a)), 6))\n"
        ),
        "loop": LOOP_CODE,
    }
    calls = {name: Call(name, code, "Finished", local_stdout(code)) for name, code in sources.items()}
    calls["nameerror"] = Call("nameerror", "x = 1\nprint(undefined_name + x)\n", "Finished", "", "NameError")
    calls["infinite"] = Call("infinite", "while True:\n    pass\n", "TimeLimitExceeded", run_timeout=2.0, adversarial=True)
    calls["membomb"] = Call("membomb", "x = b'x' * (600 * 1024 * 1024)\nprint(len(x))\n", "Finished", "", expect_stderr="MemoryError", memory_mb=256, adversarial=True)
    return calls


CALLS = build_calls()
NORMAL = ["print", "comb", "sympy", "numpy", "loop", "nameerror"]
WORKLOADS: dict[str, list[str]] = {name: [name] for name in NORMAL}
WORKLOADS["mix"] = NORMAL
# One adversarial call in seven: an infinite loop or a 600 MB allocation against a 256 MB limit.
WORKLOADS["adversarial"] = [*NORMAL, "infinite", *NORMAL, "membomb"]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    normal_latencies: list[float] = field(default_factory=list)
    errors: int = 0
    wrong: int = 0
    rejected: int = 0
    problems: list[str] = field(default_factory=list)


def check(call: Call, status: int, body: dict) -> str | None:
    """None when the answer is right, else what is wrong."""
    if status != 200:
        return f"HTTP {status}"
    run = body.get("run_result") or {}
    expected_request_status = "Success" if call.expect_status == "Finished" and call.expect_stderr is None else "Failed"
    if body.get("status") != expected_request_status:
        return f"{call.name}: status {body.get('status')!r}, expected {expected_request_status!r} ({(run.get('stderr') or '')[-120:]!r})"
    if run.get("status") != call.expect_status:
        return f"{call.name}: run status {run.get('status')!r}, expected {call.expect_status!r} ({(run.get('stderr') or '')[-120:]!r})"
    if call.expect_stdout is not None and run.get("stdout") != call.expect_stdout:
        return f"{call.name}: stdout {run.get('stdout')!r}, expected {call.expect_stdout!r}"
    if call.expect_stderr is not None and call.expect_stderr not in (run.get("stderr") or ""):
        return f"{call.name}: stderr lacks {call.expect_stderr!r}"
    return None


async def caller(session: aiohttp.ClientSession, url: str, names: list[str], offset: int, stop_at: float, tally: Tally) -> None:
    i = offset
    while time.monotonic() < stop_at:
        call = CALLS[names[i % len(names)]]
        i += 1
        payload = {
            "code": call.code, "language": "python", "run_timeout": call.run_timeout, "memory_limit_MB": call.memory_mb,
            "files": {}, "fetch_files": [], "stdin": None, "compile_timeout": 10,
        }  # fmt: skip
        started = time.monotonic()
        try:
            async with session.post(f"{url}/run_code", json=payload) as response:
                status = response.status
                body = await response.json(content_type=None) if status in (200, 400, 429, 503) else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
            tally.errors += 1
            tally.problems.append(f"{call.name}: {type(exc).__name__}")
            continue
        elapsed = time.monotonic() - started
        if status in (429, 503):
            tally.rejected += 1
            await asyncio.sleep(0.05)
            continue
        tally.latencies.append(elapsed)
        if not call.adversarial:
            tally.normal_latencies.append(elapsed)
        problem = check(call, status, body)
        if problem:
            if status != 200:
                tally.errors += 1
            else:
                tally.wrong += 1
            tally.problems.append(problem)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_config(url: str, workload: str, concurrency: int, duration: float, *, keep_latencies: bool = False) -> dict:
    names = WORKLOADS[workload]
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        started = time.monotonic()
        stop_at = started + duration
        await asyncio.gather(*(caller(session, url, names, k, stop_at, tally) for k in range(concurrency)))
        elapsed = time.monotonic() - started
    done = len(tally.latencies)
    return {
        "workload": workload,
        "concurrency": concurrency,
        "requests": done,
        "rps": done / elapsed,
        "p50_ms": quantile(tally.latencies, 0.50) * 1000,
        "p90_ms": quantile(tally.latencies, 0.90) * 1000,
        "p99_ms": quantile(tally.latencies, 0.99) * 1000,
        "normal_p99_ms": quantile(tally.normal_latencies, 0.99) * 1000,
        "errors": tally.errors,
        "wrong": tally.wrong,
        "rejected": tally.rejected,
        "problems": sorted(set(tally.problems))[:5],
        "elapsed_s": elapsed,
        **({"latencies": tally.latencies} if keep_latencies else {}),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ours(workers: int, *, as_pod: str | None = None, code_root: Path = REPO, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, int]:
    """Start our server (the code under ``code_root``), plainly or the way a pod of kind ``as_pod`` runs it
    (tests/sandbox/podlike.py: needs root). Returns the launcher, the URL and the server's pid."""
    port = free_port()
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(code_root), os.environ.get("PYTHONPATH", "")) if p), **(env or {}))
    argv = [sys.executable, "-m", "retool.sandbox", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    if as_pod:
        sys.path.insert(0, str(REPO / "tests" / "sandbox"))
        import podlike

        argv = podlike.command(as_pod, argv, expose=(str(code_root),))
    # cwd too: ``python -m`` puts the working directory first on sys.path.
    process = subprocess.Popen(argv, env=environment, cwd=str(code_root), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            import urllib.request

            with contextlib.suppress(Exception), urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return process, url, _server_pid(process.pid)
        time.sleep(0.2)
    process.kill()
    raise SystemExit("our sandbox did not become ready")


def stop_ours(process: subprocess.Popen, server: int) -> None:
    """Stop a server ``start_ours`` started as the kubelet stops a pod: SIGTERM to the server alone
    (it drains, and its template and workers end with it), then the whole group after 30 s. A
    SIGTERM to the whole group killed the workers and the template first, and the server logged
    them as deaths to repair ("worker N retired: died while idle", "template gone")."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(server, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _server_pid(launcher: int) -> int:
    """The sandbox server among the launcher and its descendants (the launcher itself when started plainly)."""
    frontier = [launcher]
    while frontier:
        pid = frontier.pop(0)
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"retool.sandbox"]:
                return pid
            for task in os.listdir(f"/proc/{pid}/task"):
                frontier += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return launcher


def isolation_summary(url: str) -> str:
    import urllib.request

    with contextlib.suppress(Exception), urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
        return json.loads(reply.read()).get("isolation", {}).get("summary") or "(no summary: a server before issue #14)"
    return "(unknown)"


async def main_async(args: argparse.Namespace, url: str) -> list[dict]:
    rows = []
    # Warm-up: the first calls of a fresh server pay for lazy caches; they are not measured.
    await run_config(url, "mix", 4, 1.0)
    for workload in args.workloads.split(","):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            row = await run_config(url, workload, concurrency, args.duration)
            row["load_avg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(
                f"{args.label:>14} {workload:>11} c={concurrency:<3} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:8.1f} ms  p90 {row['p90_ms']:8.1f} ms  "
                f"p99 {row['p99_ms']:8.1f} ms  normal-p99 {row['normal_p99_ms']:8.1f} ms  n={row['requests']:<5} err={row['errors']} wrong={row['wrong']} "
                f"429={row['rejected']} load={row['load_avg_1m']}" + (f"  e.g. {row['problems'][0][:140]}" if row["problems"] else ""),
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="benchmark this running server")
    parser.add_argument("--start-ours", action="store_true", help="start our sandbox on a free port and benchmark it")
    parser.add_argument("--workers", type=int, default=16, help="workers of the server we start")
    parser.add_argument("--label", default="", help="name printed on every row")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per configuration")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--as-pod", choices=("pod", "pod-userns", "k8s-userns"), help="start ours as a pod of this kind runs it (run as root)")
    parser.add_argument("--code-root", type=Path, default=REPO, help="start the server from this checkout (e.g. a copy of an older commit)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment of the server we start (repeatable)")
    args = parser.parse_args()
    if bool(args.url) == bool(args.start_ours):
        parser.error("give exactly one of --url and --start-ours")
    process = None
    if args.start_ours:
        env = dict(item.split("=", 1) for item in args.env)
        process, url, server = start_ours(args.workers, as_pod=args.as_pod, code_root=args.code_root, env=env)
        args.label = args.label or "retool"
    else:
        url = args.url.rstrip("/")
        args.label = args.label or "server"
    try:
        print(f"# {args.label} at {url}; {os.cpu_count()} CPUs; load average {os.getloadavg()}", flush=True)
        if process is not None:
            print(f"# isolation: {isolation_summary(url)}", flush=True)
        rows = asyncio.run(main_async(args, url))
    finally:
        if process is not None:
            stop_ours(process, server)
    if args.json:
        Path(args.json).write_text(json.dumps({"label": args.label, "rows": rows}, indent=1))
    mix = [r for r in rows if r["workload"] == "mix" and r["concurrency"] == 16]
    if mix:
        print(f"# {args.label}: mix at c=16: {mix[0]['rps']:.1f} req/s, wrong answers {sum(r['wrong'] for r in rows)} in all")
    print(f"# load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
