"""One execution can never touch another, the server or the pod — tried the way the pods run.

Every probe of issue #14, against a server started as a Kubernetes pod starts it (see ``podlike``):
``pod`` (uid 10001, no capabilities, no_new_privs, no namespaces: what the restricted Deployment
gets) and ``k8s-userns`` (``hostUsers: false``: root in a user namespace with the documented
capabilities). Each probe runs hostile code next to a victim or a bystander and checks that the
victim's answer stays right and the server stays healthy: same template, no worker restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retool.sandbox.api import RunCodeResponse
from tests.sandbox.conftest import RunningServer, descendants, start_server, stop_server
from tests.sandbox.waiting import BOUND_S, until, wait_until

pytestmark = pytest.mark.slow

KINDS = ["pod", "k8s-userns"]


@pytest.fixture(scope="module", params=KINDS)
def pod(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = start_server(3, kind=request.param, RETOOL_SANDBOX_TMP_SIZE_MB="64", RETOOL_SANDBOX_MAX_FILE_SIZE_MB="16")
    running.baseline = running.readyz()  # type: ignore[attr-defined]
    yield running
    stop_server(running)


async def post(client: httpx.AsyncClient, code: str, timeout: float = 5.0, memory_mb: int = 256) -> tuple[RunCodeResponse, float]:
    started = time.monotonic()
    reply = await client.post("/run_code", json={"code": code, "run_timeout": timeout, "memory_limit_MB": memory_mb}, timeout=60)
    assert reply.status_code == 200, reply.text
    return RunCodeResponse.model_validate(reply.json()), time.monotonic() - started


def assert_healthy(pod: RunningServer) -> None:
    """Same template as at the start, every worker alive, none replaced: nothing reached the sandbox."""
    now = pod.readyz()
    before = pod.baseline  # type: ignore[attr-defined]
    assert now["ready"] is True and now["live_workers"] == pod.workers
    assert now["template"]["pid"] == before["template"]["pid"]
    assert now["worker_restarts"] == before["worker_restarts"], now


def stdout(response: RunCodeResponse) -> str:
    assert response.run_result is not None, response
    return response.run_result.stdout or ""


def holder(server: RunningServer, name: str, content: str, *, timeout_s: float = BOUND_S) -> int:
    """The pid of the server's process whose directory holds ``name`` with ``content``."""
    found: list[int] = []

    def look() -> bool:
        for pid in descendants(server.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cwd/{name}").read_text() == content:
                    found.append(pid)
                    return True
        return False

    wait_until(look, what=f"an execution holding {name}", timeout_s=timeout_s)
    return found[0]


def cwd_holding(pod: RunningServer, name: str, content: str) -> str:
    """The working directory (as the execution sees it) of the server's process holding ``name``."""
    return os.readlink(f"/proc/{holder(pod, name, content, timeout_s=5)}/cwd")


FIND_AND_TAMPER = """
import os
targets = {{{KNOWN!r}}}
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for link in ('cwd', 'root'):
        try:
            targets.add(os.readlink(f'/proc/{{pid}}/{{link}}'))
        except OSError:
            pass
    try:
        for fd in os.listdir(f'/proc/{{pid}}/fd'):
            try:
                targets.add(os.path.dirname(os.readlink(f'/proc/{{pid}}/fd/{{fd}}')))
            except OSError:
                pass
    except OSError:
        pass
for base in ('/tmp', '/var/tmp', '/dev/shm', os.path.dirname(os.getcwd()), os.path.dirname(os.path.dirname(os.getcwd()))):
    try:
        targets.update(os.path.join(base, name) for name in os.listdir(base))
    except OSError:
        pass
for target in sorted(targets):
    path = os.path.join(target, 'answer.txt')
    if os.path.realpath(target) == os.getcwd():
        continue
    try:
        print('READ', path, open(path).read())
    except OSError:
        pass
    try:
        with open(path, 'w') as f:
            f.write('tampered')
    except OSError:
        pass
print('looked at', len(targets))
"""


async def test_a_sibling_cannot_read_or_overwrite_the_files_of_another(pod: RunningServer) -> None:
    secret = uuid.uuid4().hex
    victim = f"import time\nopen('answer.txt', 'w').write({secret!r})\ntime.sleep(1.2)\nprint(open('answer.txt').read())\n"
    async with httpx.AsyncClient(base_url=pod.url) as client:
        victim_run = asyncio.create_task(post(client, victim))
        known = await asyncio.to_thread(cwd_holding, pod, "answer.txt", secret)  # even told where it is
        attacker, _ = await post(client, FIND_AND_TAMPER.format(KNOWN=known))
        victim_answer, _ = await victim_run
    assert stdout(victim_answer) == secret + "\n", victim_answer
    assert secret not in stdout(attacker) and "looked at" in stdout(attacker), attacker
    assert_healthy(pod)


KILL_EVERYONE = """
import os, signal
me, hits = os.getpid(), []
pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != me]
for sig in (signal.SIGSTOP, signal.SIGKILL):
    for pid in pids:
        for target in (pid, -pid) if pid != 1 else (1,):  # kill(-1) "succeeds" even when every target refuses
            try:
                os.kill(target, sig)
                hits.append(target)
            except OSError:
                pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
print('saw', len(pids), 'processes; signalled', hits)
"""


async def test_a_sibling_cannot_kill_or_stop_another_execution(pod: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=pod.url) as client:
        victim_run = asyncio.create_task(post(client, "import time\ntime.sleep(1.0)\nprint('victim ok')\n"))
        await until(lambda: pod.metric("retool_sandbox_busy_workers") >= 1, what="the victim running")
        attacker, _ = await post(client, KILL_EVERYONE)
        victim_answer, elapsed = await victim_run
    assert attacker.run_result is not None and attacker.run_result.status == "Finished", attacker
    assert stdout(victim_answer) == "victim ok\n" and victim_answer.status == "Success", victim_answer
    assert elapsed < 3.0, f"the victim was held up {elapsed:.1f}s"
    assert "signalled []" in stdout(attacker), stdout(attacker)
    assert_healthy(pod)


PIDFD_AND_PID_1 = """
import os, signal
hits = []
for pid in [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
    try:
        fd = os.open(f'/proc/{pid}', os.O_RDONLY | os.O_DIRECTORY)
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            hits.append(('proc handle', pid))
        except OSError:
            pass
        os.close(fd)
    except OSError:
        pass
    try:
        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
        hits.append(('pidfd', pid))
    except OSError:
        pass
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
    try:
        os.kill(1, sig)
        hits.append(('pid 1', sig))
    except OSError:
        pass
print('hits', hits)
"""


async def test_the_template_and_the_server_cannot_be_killed_through_proc_handles_or_pidfds(pod: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=pod.url) as client:
        attacker, _ = await post(client, PIDFD_AND_PID_1)
        await asyncio.sleep(0.3)
        after, _ = await post(client, "print(6 * 7)")
    out = stdout(attacker)
    assert "proc handle" not in out and "pidfd" not in out, out
    # SIGTERM/SIGINT to pid 1 would start the server's shutdown; inside a pid namespace pid 1 is the
    # worker, which ignores signals from its own namespace (the kernel reports them delivered).
    if pod.kind == "pod":
        assert "pid 1" not in out, out
    assert stdout(after) == "42\n"
    assert_healthy(pod)


LOOPBACK = """
import socket
connected = 0
for host in ('127.0.0.1', '::1', 'localhost', '0.0.0.0'):
    try:
        s = socket.create_connection((host, {port}), timeout=1)
    except OSError as e:
        print('blocked', host, type(e).__name__)
        continue
    connected += 1
    for _ in range(40):
        body = b'{{"code": "import time\\\\ntime.sleep(5)", "run_timeout": 10}}'
        s.sendall(b'POST /run_code HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: ' + str(len(body)).encode() + b'\\r\\n\\r\\n' + body)
print('connected', connected)
"""


async def test_code_cannot_reach_the_servers_own_port(pod: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=pod.url) as client:
        attacker, _ = await post(client, LOOPBACK.format(port=pod.port))
        bystanders = await asyncio.gather(*(post(client, "import math\nprint(math.comb(10, 3))") for _ in range(3)))
    assert "connected 0" in stdout(attacker) and stdout(attacker).count("blocked") == 4, attacker
    for answer, elapsed in bystanders:
        assert stdout(answer) == "120\n" and elapsed < 2.0
    assert_healthy(pod)


FILL_SCRATCH = """
import os
written = 0
try:
    while True:
        with open(f'fill{written}', 'wb') as f:
            f.write(b'x' * (8 << 20))
        written += 1
except OSError as e:
    print('own directory full after', written * 8, 'MB:', e.strerror)
for d in ('/tmp', '/var/tmp', '/dev/shm'):
    try:
        with open(os.path.join(d, 'fill'), 'wb') as f:
            f.write(b'x' * (48 << 20))
        print('wrote 48 MB to', d)
    except OSError as e:
        print('refused', d, e.strerror)
"""


async def test_filling_the_scratch_space_costs_only_the_filler(pod: RunningServer) -> None:
    bystander = "data = b'y' * (10 << 20)\nopen('mine.bin', 'wb').write(data)\nprint(open('mine.bin', 'rb').read() == data)\n"
    async with httpx.AsyncClient(base_url=pod.url) as client:
        filler = asyncio.create_task(post(client, FILL_SCRATCH, timeout=10))
        await until(lambda: filler.done() or pod.metric("retool_sandbox_busy_workers") >= 1, what="the filler running")
        bystanders = await asyncio.gather(*(post(client, bystander) for _ in range(2)))
        attacker, elapsed = await filler
    for answer, _ in bystanders:
        assert stdout(answer) == "True\n", answer
    assert attacker.run_result is not None and attacker.run_result.status == "Finished" and elapsed < 8, attacker
    run = attacker.run_result
    assert "scratch quota of 64 MB" in (run.stderr or "") or "own directory full after" in (run.stdout or ""), run
    assert "wrote 48 MB" not in (run.stdout or ""), run
    # The pod's emptyDir (512 MB) is given back once the worker has cleaned up, just after it answered.
    def free_bytes() -> int:
        scratch = os.statvfs(f"/proc/{pod.pid}/root/tmp")
        return scratch.f_bavail * scratch.f_frsize

    await until(lambda: free_bytes() > 400 << 20, what="the filler's scratch given back", timeout_s=5)
    assert_healthy(pod)


async def test_nothing_is_left_for_later_executions(pod: RunningServer) -> None:
    marker = uuid.uuid4().hex[:12]
    paths = [f"/tmp/leak-{marker}", f"/var/tmp/leak-{marker}", f"/dev/shm/leak-{marker}", f"leak-{marker}"]
    leaver = (
        f"import os, time\nfor p in {paths!r}:\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
        "if os.fork() == 0:\n    os.setsid()\n    while True:\n"
        f"        for p in {paths!r}:\n            try:\n                open(p, 'w').write('x')\n            except OSError:\n                pass\n        time.sleep(0.01)\n"
        "print('left')\n"
    )
    checker = f"import os\nprint([os.path.exists(p) for p in {paths!r}], os.listdir('.'))\n"
    async with httpx.AsyncClient(base_url=pod.url) as client:
        assert stdout((await post(client, leaver))[0]) == "left\n"
        root = f"/proc/{pod.pid}/root"
        await until(lambda: not any(os.path.exists(root + p) for p in paths[:3]), what="the sweep after the leaver")
        later = await asyncio.gather(*(post(client, checker) for _ in range(pod.workers * 2)))
    for answer, _ in later:
        assert stdout(answer) == f"{[False] * len(paths)} []\n", answer
    assert not any(os.path.exists(root + p) for p in paths[:3])
    assert_healthy(pod)


TEN_PROCESSES = """
import os, time
children = []
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        chunks = []
        for _ in range(10):
            chunks.append(bytearray(b'x' * (30 << 20)))
            time.sleep(0.02)
        time.sleep(5)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print('all done')
"""


async def test_the_memory_limit_holds_across_all_processes_of_an_execution(pod: RunningServer) -> None:
    sharing = (
        "import os\ndata = bytearray(b'x' * (150 << 20))\npids = []\nfor _ in range(4):\n    pid = os.fork()\n"
        "    if pid == 0:\n        os._exit(0 if sum(data[::4096]) else 1)\n    pids.append(pid)\n"
        "print(all(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids))\n"
    )
    async with httpx.AsyncClient(base_url=pod.url) as client:
        greedy, elapsed = await post(client, TEN_PROCESSES, timeout=15, memory_mb=350)
        shared, _ = await post(client, sharing, timeout=15, memory_mb=350)
    run = greedy.run_result
    assert run is not None and run.return_code == -9 and "all done" not in (run.stdout or ""), greedy
    assert "processes together used" in (run.stderr or "") and "memory_limit_MB=350" in (run.stderr or ""), run.stderr
    assert elapsed < 6
    # Pages a parent shares with its children count once: forking after allocating is not over the limit.
    assert stdout(shared) == "True\n", shared
    assert_healthy(pod)


FORGE = """
import os, json
record = json.dumps({"exit_code": 0, "memory_error": False, "cpu": 0.0}).encode()
for fd in range(3, 256):
    try:
        os.write(fd, record)
    except OSError:
        pass
print('printed', flush=True)
os._exit(5)
"""


async def test_an_execution_cannot_forge_its_status(pod: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=pod.url) as client:
        forged, _ = await post(client, FORGE)
    assert forged.status == "Failed" and forged.run_result is not None, forged
    assert (forged.run_result.return_code, forged.run_result.stdout) == (5, "printed\n")
    assert_healthy(pod)


def test_readyz_reports_strong_isolation_and_its_layers(pod: RunningServer) -> None:
    isolation = pod.readyz()["isolation"]
    assert isolation["strong"] is True and isolation["summary"].startswith("strong: ")
    expected = {
        "pod": {"landlock-filesystem", "seccomp", "memory-watch", "disk-watch"},
        "k8s-userns": {"uid-per-execution", "pid-namespace", "network-namespace", "mount-namespace"},
    }
    assert expected[pod.kind] <= set(isolation["layers"]), isolation
    assert all(isolation["guards"][way] for way in ("filesystem", "signals", "ptrace", "network"))
    metrics = httpx.get(f"{pod.url}/metrics").text
    assert "retool_sandbox_isolation_strong 1.0" in metrics and 'retool_sandbox_isolation_layer{layer="seccomp"} 1.0' in metrics
