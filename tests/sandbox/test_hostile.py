"""Hostile code costs only itself: each case against the real server, with bystander requests in flight.

Every case asserts the status the code deserves, that ordinary requests sent at the same time still
succeed quickly, and (via the module's final test) that no worker had to be replaced and no process
of an execution uid survived.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from retool.sandbox.api import RunCodeResponse
from tests.sandbox.conftest import SECRET, SERVER_UID_BASE, RunningServer, leftover_processes, start_server, stop_server
from tests.sandbox.waiting import until

pytestmark = pytest.mark.slow



@dataclass(frozen=True)
class Hostile:
    code: str
    run_status: str  # expected run_result.status
    response_status: str = "Failed"
    timeout: float = 1.5
    memory_mb: int = 256
    stdout_has: str = ""
    stderr_has: str = ""
    return_code: int | None = None


CASES = {
    "fork bomb is stopped at the timeout and its processes are killed": Hostile(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "TimeLimitExceeded"
    ),
    "memory bomb gets MemoryError at memory_limit_MB": Hostile("x = bytearray(3 * 1024**3)\n", "Finished", stderr_has="MemoryError"),
    "growing memory bomb gets MemoryError": Hostile("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))\n", "Finished", stderr_has="MemoryError"),
    "memory limit cannot be raised again (hard rlimit)": Hostile(
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n", "Finished", stderr_has="ValueError"
    ),
    "infinite loop is killed at run_timeout": Hostile("while True:\n    pass\n", "TimeLimitExceeded", timeout=1.0),
    "busy loop inside numpy's C code is killed at run_timeout": Hostile(
        "import numpy as np\na = np.random.rand(2500, 2500)\nwhile True:\n    np.linalg.eigvals(a)\n", "TimeLimitExceeded", timeout=1.0
    ),
    "killing its parent is refused": Hostile("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('parent survived')\n", "Finished", stderr_has="PermissionError"),
    # kill(-1) answers 0 as soon as its namespace holds another process, even one it may not signal
    # (the worker's zygote, root): what matters is that it reached nothing.
    "kill(-1) reaches only its own processes": Hostile(
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\nprint('still here')\n", "Finished", response_status="Success", stdout_has="still here"
    ),
    "huge output is capped with a marker and returns at once": Hostile(
        "import sys\nsys.stdout.write('x' * 10_000_000)\n", "Finished", response_status="Success", stdout_has="[output truncated: 10000000 bytes written"
    ),
    "endless output is capped and stopped at the timeout": Hostile(
        "while True:\n    print('y' * 1000)\n", "TimeLimitExceeded", timeout=1.0, stdout_has="[output truncated"
    ),
    "deep recursion raises RecursionError": Hostile("def f(n):\n    return f(n + 1)\nf(0)\n", "Finished", stderr_has="RecursionError"),
    "segfault via ctypes is reported as SIGSEGV": Hostile("import ctypes\nctypes.string_at(0)\n", "Finished", stderr_has="SIGSEGV", return_code=-11),
    "sys.exit with a code is a failure with that code": Hostile("print('bye')\nimport sys\nsys.exit(3)\n", "Finished", stdout_has="bye", return_code=3),
    "sys.exit(0) is a success": Hostile("import sys\nsys.exit(0)\n", "Finished", response_status="Success", return_code=0),
    "os._exit skips the interpreter's exit": Hostile("import os, sys\nprint('flushed', flush=True)\nos._exit(7)\n", "Finished", stdout_has="flushed", return_code=7),
    "detached double-forked daemon does not outlive its request": Hostile(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\nprint('parent done')\n",
        "Finished",
        response_status="Success",
        stdout_has="parent done",
    ),
}


async def post(client: httpx.AsyncClient, code: str, timeout: float = 2.0, memory_mb: int = 256) -> tuple[RunCodeResponse, float]:
    started = time.monotonic()
    reply = await client.post("/run_code", json={"code": code, "language": "python", "run_timeout": timeout, "memory_limit_MB": memory_mb}, timeout=60)
    assert reply.status_code == 200, reply.text
    return RunCodeResponse.model_validate(reply.json()), time.monotonic() - started


async def with_bystanders(server: RunningServer, code: str, timeout: float, memory_mb: int) -> RunCodeResponse:
    """Run the hostile code while two ordinary requests go through the same replica."""
    async with httpx.AsyncClient(base_url=server.url) as client:
        hostile = asyncio.create_task(post(client, code, timeout, memory_mb))
        await until(lambda: hostile.done() or server.metric("retool_sandbox_busy_workers") >= 1, what="the hostile code running")
        bystanders = await asyncio.gather(*(post(client, "import math\nprint(math.comb(10, 3))") for _ in range(2)))
        response, _ = await hostile
        for answer, elapsed in bystanders:
            assert answer.status == "Success" and answer.run_result is not None and answer.run_result.stdout == "120\n"
            assert elapsed < 2.0, f"a bystander took {elapsed:.2f}s"
        return response


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_hostile_code_costs_only_itself(server: RunningServer, case: Hostile) -> None:
    response = await with_bystanders(server, case.code, case.timeout, case.memory_mb)
    run = response.run_result
    assert run is not None, response
    assert (response.status, run.status) == (case.response_status, case.run_status), run
    assert case.stdout_has in (run.stdout or "")
    assert case.stderr_has in (run.stderr or "")
    if case.return_code is not None:
        assert run.return_code == case.return_code
    if run.status == "TimeLimitExceeded":
        assert run.execution_time is not None and case.timeout <= run.execution_time < case.timeout + 1.0


async def test_numpy_and_scipy_run_under_a_small_memory_limit(server: RunningServer) -> None:
    code = "import numpy as np, scipy.linalg\nprint(round(float(scipy.linalg.det(np.eye(3) * 2)), 3), np.ones(1000).sum())\n"
    async with httpx.AsyncClient(base_url=server.url) as client:
        response, _ = await post(client, code, memory_mb=64)
    assert response.status == "Success" and response.run_result.stdout == "8.0 1000.0\n", response


SECRET_SHAPES = {
    # The root server: executions in pid namespaces of their own, the server out of their sight.
    "root": (None, 0, {}),
    # The restricted pod: executions share the server's uid and pid namespace (the server is their
    # /proc/1); Landlock and the server's non-dumpable /proc entries keep its environment closed.
    "pod": ("pod", 10052, {}),
    # ... on a kernel before 5.13: only the non-dumpable entries.
    "pod without Landlock": ("pod", 10053, {"RETOOL_SANDBOX_LANDLOCK_MAX_ABI": "0"}),
}
DEPLOYED_SECRETS = {"AWS_SECRET_ACCESS_KEY": SECRET, "MLFLOW_TRACKING_URI": f"http://retool:{SECRET}@mlflow.retool-runs.svc:5000"}
"""How a deployed replica holds credentials: a Secret exposed through envFrom, a URI with a password
(beside ``RETOOL_SANDBOX_TEST_SECRET``, which every test server has)."""


@pytest.mark.parametrize("shape", SECRET_SHAPES, ids=SECRET_SHAPES)
async def test_no_secret_reaches_the_code(server: RunningServer, shape: str) -> None:
    kind, uid, env = SECRET_SHAPES[shape]
    target = server if kind is None else start_server(1, kind=kind, uid=uid, **env, **DEPLOYED_SECRETS)
    try:
        if os.geteuid() == 0:  # (a non-root test process may not read a non-dumpable server's environment)
            held = Path(f"/proc/{target.pid}/environ").read_bytes().decode(errors="replace")
            assert SECRET in held, "the server does not hold the secret: the test could not fail"
        code = (
            "import glob, json, os\nfound = {'os.environ': repr(dict(os.environ))}\n"
            "for path in ['/proc/1/environ', '/proc/1/cmdline', '/proc/self/environ', f'/proc/{os.getppid()}/environ', '/proc/PID/environ', *glob.glob('/proc/*/environ')]:\n"
            "    try:\n        found[path] = open(path, 'rb').read().decode(errors='replace')\n    except OSError as e:\n        found[path] = type(e).__name__\n"
            "print(json.dumps(found))\n"
        ).replace("PID", str(target.process.pid))
        async with httpx.AsyncClient(base_url=target.url) as client:
            response, _ = await post(client, code)
        assert response.status == "Success", response
        out = response.run_result.stdout
        for leaked in (SECRET, "RETOOL_SANDBOX_TEST_SECRET", *DEPLOYED_SECRETS):
            assert leaked not in out, f"{leaked} reached the code: {out}"
        if kind is not None:  # the code saw the server (its /proc/1) and was refused its environment
            found = json.loads(out)
            assert "retool.sandbox" in found["/proc/1/cmdline"] and found["/proc/1/environ"] == "PermissionError", found
    finally:
        if target is not server:
            stop_server(target)


async def test_writes_outside_the_temp_dir_do_not_land(server: RunningServer, tmp_path) -> None:
    marker = uuid.uuid4().hex
    targets = [f"/tmp/escape-{marker}", f"/var/tmp/escape-{marker}", f"/dev/shm/escape-{marker}", str(tmp_path / f"escape-{marker}"), f"/escape-{marker}", f"/etc/escape-{marker}"]
    code = (
        f"import os\nfor path in {targets!r}:\n"
        "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n    except OSError as e:\n        print('refused', path, type(e).__name__)\n"
        "open('inside.txt', 'w').write('fine')\nprint('inside ok')\n"
    )
    async with httpx.AsyncClient(base_url=server.url) as client:
        response, _ = await post(client, code)
    assert response.status == "Success" and "inside ok" in response.run_result.stdout, response
    for path in targets:
        assert not os.path.exists(path), f"{path} was written on the host: {response.run_result.stdout}"


async def test_no_network_not_even_loopback(server: RunningServer) -> None:
    port = server.url.rsplit(":", 1)[1]
    code = (
        "import socket\n"
        f"for host, port in [('127.0.0.1', {port}), ('::1', {port}), ('8.8.8.8', 53)]:\n"
        "    try:\n        socket.create_connection((host, port), timeout=1).close()\n        print('connected', host)\n"
        "    except OSError as e:\n        print('blocked', host, type(e).__name__)\n"
    )
    async with httpx.AsyncClient(base_url=server.url) as client:
        response, _ = await post(client, code)
    assert response.status == "Success", response
    assert "connected" not in response.run_result.stdout
    assert response.run_result.stdout.count("blocked") == 3
    assert server.readyz()["isolation"]["network_isolated"] is True


async def test_dead_workers_are_replaced(server: RunningServer) -> None:
    """Kill an idle worker from outside (as a crash would): no request fails, the replica refills."""
    template = server.readyz()["template"]["pid"]
    keepers = [int(pid) for pid in Path(f"/proc/{template}/task/{template}/children").read_text().split()]
    before = server.readyz()["worker_restarts"]
    os.kill(keepers[0], 9)
    await until(lambda: server.readyz()["worker_restarts"] == before + 1, what="the pool noticing the killed worker")
    async with httpx.AsyncClient(base_url=server.url) as client:
        results = await asyncio.gather(*(post(client, "print(6 * 7)") for _ in range(8)))
    assert [r.status for r, _ in results] == ["Success"] * 8
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and server.readyz()["live_workers"] < server.workers:
        await asyncio.sleep(0.1)
    state = server.readyz()
    assert state["live_workers"] == server.workers and state["worker_restarts"] == before + 1
    async with httpx.AsyncClient(base_url=server.url) as client:
        response, _ = await post(client, "print(6 * 7)")
    assert response.run_result.stdout == "42\n"


def test_zz_no_execution_process_survives_and_metrics_saw_it(server: RunningServer) -> None:
    """Runs last in this module: everything above left no process behind and was counted."""
    deadline = time.monotonic() + 5
    while leftover_processes(range(SERVER_UID_BASE, SERVER_UID_BASE + server.workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(range(SERVER_UID_BASE, SERVER_UID_BASE + server.workers)) == []
    assert server.metric("retool_sandbox_timeouts_total") >= 4
    assert server.metric("retool_sandbox_memory_kills_total") >= 2
    assert server.metric("retool_sandbox_output_truncated_total") >= 2
