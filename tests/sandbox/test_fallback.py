"""Each layer forced off in turn, as on the kernels and clusters the sandbox meets: what still holds,
and that /readyz says what is missing.

- a restricted pod on Linux 6.8 (Landlock ABI 4: no signal scope, the seccomp guard takes over),
- a restricted pod on Linux 5.10 (no Landlock at all: weak, and /readyz says so),
- a root server without namespaces (a uid of its own per execution),
- a non-root pod allowed user namespaces (the worker's user-namespace mode, once a restart loop),
- strict mode on a weak replica: never ready, runs nothing.

Each fallback server is started without a pid namespace of its own, so the last test can kill it
outright and check that no execution outlives it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import sandbox_uid_base
from tests.sandbox.conftest import RunningServer, descendants, processes_of_uids, start_server, stop_server
from tests.sandbox.test_cross_execution import FIND_AND_TAMPER, KILL_EVERYONE, LOOPBACK, holder, post, stdout
from tests.sandbox.waiting import until, wait_until

pytestmark = pytest.mark.slow

FALLBACKS = {
    "pod on Linux 6.8 (Landlock ABI 4)": ("pod", 10021, {"RETOOL_SANDBOX_LANDLOCK_MAX_ABI": "4", "RETOOL_SANDBOX_REQUIRE_ISOLATION": "true"}),
    "pod on Linux 5.10 (no Landlock)": ("pod", 10022, {"RETOOL_SANDBOX_LANDLOCK_MAX_ABI": "0"}),
    "root without namespaces": (None, 0, {"RETOOL_SANDBOX_NAMESPACES": "off", "RETOOL_SANDBOX_UID_BASE": str(sandbox_uid_base(2))}),
}


@pytest.fixture(scope="module", params=FALLBACKS.values(), ids=FALLBACKS.keys())
def fallback(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    kind, uid, env = request.param
    running = start_server(2, kind=kind, uid=uid or 10001, pid_namespace=False, **env)
    running.uids = {uid} if uid else set(range(62000, 62002))  # type: ignore[attr-defined]
    yield running
    if running.process.poll() is None:
        stop_server(running)


def execution_processes(server: RunningServer) -> list[int]:
    """Live processes of an execution uid (the server's own uid too, for a non-root pod)."""
    return processes_of_uids(server.uids, live=True)  # type: ignore[attr-defined]


def test_readyz_says_what_holds_and_what_is_missing(fallback: RunningServer) -> None:
    isolation = fallback.readyz()["isolation"]
    problems = " ".join(isolation["problems"])
    if isolation["landlock_abi_used"] == 4:
        assert isolation["strong"] is True and "no signal scope" in problems and "landlock-network" in isolation["layers"]
        assert fallback.readyz()["ready"] is True  # strict, and strong: ready
    elif isolation["landlock_abi_used"] == 0:
        assert isolation["strong"] is False and isolation["guards"]["filesystem"] == [] and "no Landlock" in problems
        assert {"seccomp", "scratch-sweep", "disk-watch"} <= set(isolation["layers"])
    else:
        assert isolation["strong"] is True and isolation["privilege_drop"] is True and "namespaces turned off" in problems


RELEASED = "released"
RELEASE_BOUND_S = 20.0


def victim(marker: str, content: str, then: str) -> str:
    """A victim's code: writes ``marker`` (``content``) in its directory, then waits until the test
    releases it (``release``), at most ``RELEASE_BOUND_S``, then runs ``then``. So it is running for
    the whole attack however long the attack takes, and no longer (a fixed 6 s sleep did both worse)."""
    return (
        f"import os, time\nopen({marker!r}, 'w').write({content!r})\n"
        f"deadline = time.monotonic() + {RELEASE_BOUND_S}\n"
        f"while not os.path.exists({RELEASED!r}) and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
        f"print('released' if os.path.exists({RELEASED!r}) else 'never released')\n{then}"
    )


def release(pid: int) -> None:
    """Let the victim ``pid`` finish: ``RELEASED`` in its directory, written from outside (as root)."""
    Path(f"/proc/{pid}/cwd/{RELEASED}").touch()


async def test_siblings_and_the_server_cannot_be_signalled(fallback: RunningServer) -> None:
    before = fallback.readyz()
    token = uuid.uuid4().hex
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        victim_run = asyncio.create_task(post(client, victim("victim-up", token, "print('victim ok')\n"), timeout=30))
        victim_pid = await asyncio.to_thread(holder, fallback, "victim-up", token)
        attacker, _ = await post(client, KILL_EVERYONE)
        attacked_while_running = not victim_run.done()  # else the attack proved nothing
        release(victim_pid)
        answer, elapsed = await victim_run
    assert attacked_while_running, "the victim ended before the attacker ran: nothing was checked"
    assert stdout(answer) == "released\nvictim ok\n" and elapsed < RELEASE_BOUND_S, stdout(answer)
    assert "signalled []" in stdout(attacker), stdout(attacker)
    after = fallback.readyz()
    assert after["template"]["pid"] == before["template"]["pid"] and after["worker_restarts"] == before["worker_restarts"]


async def test_the_servers_port_is_out_of_reach(fallback: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        attacker, _ = await post(client, LOOPBACK.format(port=fallback.port))
    assert "connected 0" in stdout(attacker), attacker


async def test_a_sibling_cannot_find_another_executions_files(fallback: RunningServer) -> None:
    """Without Landlock, names nobody can list are what keeps siblings apart: the attacker is not told the path."""
    secret = uuid.uuid4().hex
    weak = fallback.readyz()["isolation"]["landlock_abi_used"] == 0
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        victim_run = asyncio.create_task(post(client, victim("answer.txt", secret, "print(open('answer.txt').read())\n"), timeout=30))
        victim_pid = await asyncio.to_thread(holder, fallback, "answer.txt", secret)
        known = os.readlink(f"/proc/{victim_pid}/cwd")
        attacker, _ = await post(client, FIND_AND_TAMPER.format(KNOWN="/nonexistent" if weak else known))
        attacked_while_running = not victim_run.done()
        release(victim_pid)
        answer, _ = await victim_run
    assert attacked_while_running, "the victim ended before the attacker ran: nothing was checked"
    assert stdout(answer) == f"released\n{secret}\n" and secret not in stdout(attacker), stdout(attacker)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\nprint(1)\n",
    ],
    ids=["fork bomb", "detached daemon"],
)
async def test_executions_end_completely(fallback: RunningServer, code: str) -> None:
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        await post(client, code, timeout=1.0)
    template = fallback.readyz()["template"]["pid"]
    expected = 3 * fallback.workers  # each worker, its zygote and its one pre-forked process
    # Exactly that many: nothing the execution started is left, and its worker has pre-forked the
    # next process again (which a loaded machine may take a moment to do).
    await until(lambda: len(descendants(template)) == expected, what=f"{expected} processes under the template")
    # And it stays so through a full cycle of every worker: a survivor standing in for a late
    # pre-fork would leave one process too many once every worker has pre-forked again.
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        await asyncio.gather(*(post(client, "print(1)") for _ in range(fallback.workers)))
    await until(lambda: len(descendants(template)) == expected, what=f"{expected} processes under the template after a cycle")
    assert fallback.readyz()["template"]["pid"] == template


async def test_scratch_leftovers_do_not_reach_later_executions(fallback: RunningServer) -> None:
    marker = uuid.uuid4().hex[:12]
    paths = [f"/tmp/leak-{marker}", f"/var/tmp/leak-{marker}", f"/dev/shm/leak-{marker}"]
    leaver = f"for p in {paths!r}:\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        await post(client, leaver)
        root = f"/proc/{fallback.pid}/root" if fallback.kind != "root" else ""
        # the sweep runs in the background after each execution
        await until(lambda: not any(Path(root + p).exists() for p in paths), what="the sweep after the leaver")
        later = await asyncio.gather(*(post(client, f"import os\nprint([os.path.exists(p) for p in {paths!r}])") for _ in range(3)))
    for answer, _ in later:
        assert stdout(answer) == "[False, False, False]\n", answer
    assert not any(Path(root + p).exists() for p in paths)


async def test_own_children_can_be_signalled_where_the_kernel_scopes_signals(fallback: RunningServer) -> None:
    """With Landlock's signal scope (ABI >= 6) code stops its children by pid; below it, the seccomp
    guard allows only the execution's own process and process group (documented in docs/sandbox.md)."""
    code = (
        "import os, signal, time\npid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "try:\n    os.kill(pid, signal.SIGKILL)\n    print('by pid', os.waitpid(pid, 0)[1])\nexcept PermissionError:\n    print('refused')\n"
    )
    scoped = fallback.readyz()["isolation"]["landlock_abi_used"] >= 6
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        answer, _ = await post(client, code)
    assert stdout(answer) == ("by pid 9\n" if scoped else "refused\n"), answer


FORK_UNTIL_REFUSED = """
import os
r, w = os.pipe()
started = 0
while started < 500:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    started += 1
os.close(w)
print(started)
"""


async def test_an_execution_sharing_the_uid_may_start_its_own_max_processes(fallback: RunningServer) -> None:
    """RLIMIT_NPROC counts every process of the uid: where executions share the replica's, each is
    given the replica's count on top of MAX_PROCESSES (64), so it can start that many processes of
    its own, and a fork past them is refused. The kernel counts threads too, which the count (of
    processes) does not see: the server's few threads are the slack below 64. The worker's watch
    ends an execution past MAX_PROCESSES tasks of its own, itself included (issue 49): this one
    either ends that way, or is refused first (or exits within the ~10 ms between two ticks)."""
    if fallback.kind != "pod":
        pytest.skip("a uid of its own per execution: RLIMIT_NPROC is the execution's alone")
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        answer, _ = await post(client, FORK_UNTIL_REFUSED, timeout=30, memory_mb=8192)  # each fork counts whole without Landlock
    assert answer.run_result is not None
    if answer.run_result.return_code == -9:
        assert "over the sandbox's limit of 64 (MAX_PROCESSES)" in (answer.run_result.stderr or ""), answer
        return
    assert stdout(answer).strip().isdigit(), answer
    started = int(stdout(answer))
    assert 64 - 4 <= started <= 64, answer


async def test_zz_nothing_outlives_a_killed_server(fallback: RunningServer) -> None:
    """SIGKILL the server while an execution runs with a detached daemon: everything goes with it."""
    marker = uuid.uuid4().hex
    daemon = (
        "import os, time\nif os.fork() == 0:\n    try:\n        os.setsid()  # refused by the filter: it stays a daemon of the session\n"
        "    except OSError:\n        pass\n    if os.fork() == 0:\n"
        f"        open('daemon-up', 'w').write({marker!r})\n        time.sleep(60)\n    os._exit(0)\ntime.sleep(30)\n"
    )
    async with httpx.AsyncClient(base_url=fallback.url) as client:
        running = asyncio.create_task(post(client, daemon, timeout=60))
        await asyncio.to_thread(holder, fallback, "daemon-up", marker)  # the detached daemon is running
        os.kill(fallback.pid, signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            await running
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and execution_processes(fallback):
        await asyncio.sleep(0.05)
    assert execution_processes(fallback) == []
    fallback.process.wait(timeout=5)


# ---------------------------------------------------------------- user namespaces, not root


@pytest.fixture(scope="module")
def userns() -> Iterator[RunningServer]:
    running = start_server(2, kind="pod-userns", uid=10023, pid_namespace=False)
    running.uids = {10023}  # type: ignore[attr-defined]
    yield running
    if running.process.poll() is None:
        stop_server(running)


async def test_user_namespace_workers_serve_without_restarting(userns: RunningServer) -> None:
    """Maps written, capabilities dropped, private pid and network namespaces, and no restart loop."""
    code = (
        "import os, socket\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "try:\n    socket.socket(socket.AF_INET).connect(('127.0.0.1', 1))\n    net = 'reached'\nexcept OSError:\n    net = 'none'\n"
        "print(os.getuid(), status['CapEff'].strip(), os.getpid() < 10, net, os.getcwd())\n"
    )
    async with httpx.AsyncClient(base_url=userns.url) as client:
        answers = [await post(client, code) for _ in range(6)]
    for answer, _ in answers:
        assert stdout(answer) == "10023 0000000000000000 True none /tmp\n", answer
    await until(lambda: userns.readyz()["busy_workers"] == 0, what="both workers idle again")
    state = userns.readyz()
    assert state["isolation"]["mode"] == "user-namespaces" and state["isolation"]["strong"] is True
    assert state["worker_restarts"] == 0 and state["live_workers"] == 2


async def test_zz_nothing_outlives_a_killed_user_namespace_server(userns: RunningServer) -> None:
    await test_zz_nothing_outlives_a_killed_server(userns)


# ---------------------------------------------------------------- strict


def test_a_strict_replica_without_strong_isolation_never_becomes_ready() -> None:
    weak = start_server(1, kind="pod", uid=10024, wait="/healthz", RETOOL_SANDBOX_LANDLOCK_MAX_ABI="0", RETOOL_SANDBOX_REQUIRE_ISOLATION="true")
    try:
        wait_until(lambda: httpx.get(f"{weak.url}/readyz", timeout=5).json().get("isolation", {}).get("layers"), what="the pool to report its isolation")
        ready = httpx.get(f"{weak.url}/readyz", timeout=5)
        refused = httpx.post(f"{weak.url}/run_code", json={"code": "print(1)"}, timeout=5)
    finally:
        stop_server(weak)
    assert ready.status_code == 503 and ready.json()["isolation"]["strong"] is False
    assert any("isolation required but not strong" in reason for reason in ready.json()["not_ready_because"])
    assert refused.status_code == 503 and "isolation is not strong" in refused.json()["message"]

