"""Channels the accounting did not model (issue 23): each attack costs only its own execution.

Run the way the pods run (``pod``: uid 10001, no capabilities, no namespaces; ``k8s-userns``: root
of a user namespace with per-worker namespaces) inside a memory cgroup standing in for the pod's
limit. Each attack is answered with an error or a limit, a concurrent victim's answer stays right,
and nothing of the attacker is left for the executions after it.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.sandbox import memcg
from tests.sandbox.conftest import RunningServer, descendants, start_server, stop_server
from tests.sandbox.waiting import until

pytestmark = pytest.mark.slow

POD_MEMORY = 1536 << 20
"""The replica's memory limit (a pod's ``resources.limits.memory``)."""
TMP_MB = 64


@pytest.fixture(scope="module", params=["pod", "k8s-userns"])
def pod(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    if reason := memcg.why_not():
        pytest.skip(reason)
    with memcg.limited(POD_MEMORY) as inside:
        with inside:
            running = start_server(2, kind=request.param, RETOOL_SANDBOX_TMP_SIZE_MB=str(TMP_MB))
        running.baseline = running.readyz()  # type: ignore[attr-defined]
        yield running
        stop_server(running)


async def run(client: httpx.AsyncClient, code: str, *, timeout: float = 20, memory_mb: int = 256) -> dict:
    reply = await client.post("/run_code", json={"code": code, "run_timeout": timeout, "memory_limit_MB": memory_mb}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def out(answer: dict) -> str:
    return (answer["run_result"] or {}).get("stdout") or ""


def err(answer: dict) -> str:
    return (answer["run_result"] or {}).get("stderr") or ""


VICTIM = "b = bytearray(150 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint(sum(b[::4096]))\n"
"""A legitimate 150 MB execution; its answer is the number of pages it touched."""
VICTIM_ANSWER = str((150 << 20) // 4096)


async def attack_with_victim(pod: RunningServer, attack: str, *, memory_mb: int = 128) -> tuple[dict, dict, dict]:
    """The attack and a victim side by side, then the victim again on a replica the attack has ended."""
    async with httpx.AsyncClient(base_url=pod.url) as client:
        attacker, victim = await asyncio.gather(run(client, attack, memory_mb=memory_mb), run(client, VICTIM))
        after = await asyncio.gather(*(run(client, VICTIM) for _ in range(pod.workers)))
    for answer in (victim, *after):
        assert answer["status"] == "Success" and out(answer).strip() == VICTIM_ANSWER, answer
    now = pod.readyz()
    assert now["worker_restarts"] == pod.baseline["worker_restarts"] and now["live_workers"] == pod.workers, now  # type: ignore[attr-defined]
    return attacker, victim, after[0]


SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
results = []
for call, args in (("shmget", ({key}, 1 << 30, IPC_CREAT | 0o666)), ("msgget", ({key}, IPC_CREAT | 0o666)), ("semget", ({key}, 1, IPC_CREAT | 0o666))):
    ident = getattr(libc, call)(*[ctypes.c_long(a) for a in args])
    results.append((call, ident, ctypes.get_errno()))
    if call == "shmget" and ident >= 0:
        libc.shmat.restype = ctypes.c_void_p
        address = libc.shmat(ident, None, 0)
        ctypes.memset(address, 1, 1 << 30)
print(results)
"""


def sysv_objects(key: int) -> list[str]:
    """Lines of /proc/sysvipc/* naming ``key`` (SysV objects are global to the IPC namespace)."""
    found = []
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            if int(line.split()[0]) == key:
                found.append(f"{kind}: {line}")
    return found


async def test_system_v_ipc_is_refused_and_leaves_nothing(pod: RunningServer) -> None:
    key = random.randrange(1 << 20, 1 << 30)
    try:
        attacker, _, _ = await attack_with_victim(pod, SYSV.format(key=key))
        assert out(attacker).strip() == str([("shmget", -1, 1), ("msgget", -1, 1), ("semget", -1, 1)]), attacker
        assert sysv_objects(key) == []
    finally:  # on a failure, nothing left on this machine
        for flag in ("-M", "-Q", "-S"):
            subprocess.run(["ipcrm", flag, str(key)], capture_output=True, check=False)


MEMFD = """
import os
try:
    fd = os.memfd_create("hidden")
except PermissionError:
    print("refused")
else:
    chunk = b"x" * (1 << 20)
    for _ in range(1200):
        os.write(fd, chunk)
    print("held 1200 MB")
"""


async def test_memfd_memory_no_process_shows_is_refused(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, MEMFD)
    assert out(attacker).strip() == "refused", attacker


O_TMPFILE = """
import os
try:
    os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
except PermissionError:
    print("refused")
"""

UNLINKED = """
import os, time
chunk = b"x" * (1 << 20)
held = []
for n in range(4):  # each file under RLIMIT_FSIZE, together twice the quota
    f = open(f"hidden{{n}}.bin", "wb", buffering=0)
    os.unlink(f"hidden{{n}}.bin")
    held.append(f)
    for _ in range({tmp_mb} // 2):
        f.write(chunk)
time.sleep(1)
print("wrote", 2 * {tmp_mb}, "MB")
"""


async def test_an_unnamed_file_cannot_be_made_with_o_tmpfile(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, O_TMPFILE)
    assert out(attacker).strip() == "refused", attacker


async def test_a_file_removed_while_open_counts_against_the_scratch_quota(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, UNLINKED.format(tmp_mb=TMP_MB))
    assert attacker["status"] == "Failed" and "wrote" not in out(attacker), attacker
    assert "scratch quota" in err(attacker) or "No space left" in err(attacker), attacker


HIDDEN_DIRECTORY = """
import os, time
os.mkdir("hidden", 0o300)  # writable and searchable, not listable: a watch running as this uid cannot list it
chunk = b"x" * (1 << 20)
for n in range(4):  # each file under RLIMIT_FSIZE, together twice the quota
    with open(f"hidden/f{{n}}", "wb") as f:
        for _ in range({tmp_mb} // 2):
            f.write(chunk)
time.sleep(1)
print("wrote", 2 * {tmp_mb}, "MB")
"""


async def test_a_directory_made_unreadable_still_counts_against_the_scratch_quota(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, HIDDEN_DIRECTORY.format(tmp_mb=TMP_MB))
    assert attacker["status"] == "Failed" and "wrote" not in out(attacker), attacker
    assert "scratch quota" in err(attacker) or "No space left" in err(attacker), attacker


EXEC_CHILDREN = """
import subprocess
hold = "b = bytearray(40 << 20)\\nfor i in range(0, len(b), 4096):\\n    b[i] = 1\\nimport time\\ntime.sleep(4)\\n"
python = {python!r}
children = [subprocess.Popen([python, "-c", hold]) for _ in range(8)]
for child in children:
    child.wait()
print("8 x 40 MB held")
"""


async def test_processes_that_exec_count_whole_against_the_memory_limit(pod: RunningServer) -> None:
    # The interpreter itself, resolved here: the checkout's .venv link may sit under /tmp, which the
    # sandbox's private /tmp (k8s-userns) hides from the execution.
    attacker, _, _ = await attack_with_victim(pod, EXEC_CHILDREN.format(python=os.path.realpath(sys.executable)), memory_mb=128)
    assert attacker["status"] == "Failed" and "held" not in out(attacker), attacker
    assert "memory" in err(attacker), attacker


PRIORITY = """
import os
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
except OSError as exc:
    lowered = type(exc).__name__
else:
    lowered = "lowered"
try:
    os.setsid()
    session = "new session"
except PermissionError:
    session = "refused"
print(open("/proc/self/oom_score_adj").read().strip(), os.getpriority(os.PRIO_PROCESS, 0), lowered, session)
"""


async def test_executions_are_the_oom_killers_first_choice_and_cannot_leave_their_session(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, PRIORITY)
    assert out(attacker).split() == ["1000", "10", "PermissionError", "refused"], attacker


DEEP = """
import os
for _ in range(1500):
    os.mkdir("d")
    os.chdir("d")
    try:
        os.chmod(".", 0o300)
    except PermissionError:  # refused where executions share the replica's uid: the chain stays deep
        pass
print("deep")
"""


async def test_a_1500_deep_directory_chain_is_cleaned_up_without_losing_the_worker(pod: RunningServer) -> None:
    attacker, _, _ = await attack_with_victim(pod, DEEP)
    assert out(attacker).strip() == "deep", attacker
    assert not leftover_directories(pod)


def scratch_root(pod: RunningServer) -> Path | None:
    """The replica's directory of per-execution directories, seen from here (None with private /tmp)."""
    tmp = Path(f"/proc/{pod.pid}/root/tmp")
    roots = [p for p in tmp.iterdir() if p.name.startswith("retool-sandbox-")]
    return roots[0] if roots else None


def leftover_directories(pod: RunningServer) -> list[Path]:
    """Execution directories beyond each worker's one for its pre-forked process."""
    root = scratch_root(pod)
    if root is None:
        return []
    return [d for slot in root.iterdir() for d in sorted(slot.iterdir())[1:]] + [s for s in root.iterdir() if not s.name.startswith("w")]


async def test_a_dead_workers_directory_is_swept_when_it_is_replaced(pod: RunningServer) -> None:
    if pod.kind != "pod":
        pytest.skip("with a private /tmp a dead worker's scratch goes with its mount namespace")
    marker = f"m{random.getrandbits(64):x}"
    code = f"open('{marker}', 'w').write('x')\nimport time\ntime.sleep(60)\n"
    async with httpx.AsyncClient(base_url=pod.url) as client:
        running = asyncio.ensure_future(run(client, code, timeout=60))
        holder = await asyncio.to_thread(wait_for_holder, pod, marker)
        workdir = Path(f"/proc/{holder}/cwd").resolve()
        seen = Path(f"/proc/{pod.pid}/root") / str(workdir).lstrip("/")
        assert (seen / marker).exists()
        worker = parent_of(parent_of(holder))  # execution -> zygote -> worker
        restarts = pod.readyz()["worker_restarts"]
        os.kill(worker, 9)
        answer = await running
        assert answer["status"] == "Failed" and answer["run_result"]["status"] == "Error", answer
        await until(lambda: pod.readyz()["worker_restarts"] > restarts and pod.readyz()["live_workers"] == pod.workers, what="the worker replaced")
    assert not seen.parent.exists()
    pod.baseline = pod.readyz()  # type: ignore[attr-defined]


def wait_for_holder(pod: RunningServer, name: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in descendants(pod.pid):
            if os.path.exists(f"/proc/{pid}/cwd/{name}"):
                return pid
        time.sleep(0.02)
    raise AssertionError(f"no execution holds {name}")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

