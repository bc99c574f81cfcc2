"""Issue 49: two accounting holes of the restricted ``pod`` shape (one uid for every execution, no
cgroup of its own per execution), each attack run against a server started the way a pod runs it.

1. The memory watch subtracted the warm interpreter's baseline from every forked process: a fork
   that unmaps what it inherited and maps fresh memory keeps its stack start, and its resident size
   stays under the baseline, so it counted 0. Now the resident sizes are summed and the baseline
   subtracted once (``accounting.estimate``), and the exact read shows the fresh pages.
2. RLIMIT_NPROC of a shared uid is ``MAX_PROCESSES`` + the replica's process count at dispatch;
   when other executions' processes counted there exit, their room goes to this one. Now the
   worker's watch ends an execution with more than ``MAX_PROCESSES`` tasks of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retool.sandbox import accounting
from tests.sandbox.conftest import RunningServer, descendants, start_server, stop_server
from tests.sandbox.test_unaccounted import err, out
from tests.sandbox.test_unaccounted import run as run_code
from tests.sandbox.waiting import until, wait_until

pytestmark = pytest.mark.slow

MAX_PROCESSES = 8
WORKERS = 3
MAX_OPEN_FILES = 1024
"""RLIMIT_NOFILE: room for ~500 pipes in one process (the pipe attack needs no fork, which the uid's
RLIMIT_NPROC, shared with the server's threads, may refuse)."""
UID = 10049
"""A uid no other test server uses: RLIMIT_NPROC counts a uid's tasks machine-wide."""


@pytest.fixture(scope="module", params=["pod", "k8s-userns"])
def pod(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """Each attack in the restricted pod (one uid shared by every execution) and in the ``hostUsers:
    false`` pod (root in a user namespace, a uid per execution); neither has a cgroup per execution."""
    running = start_server(WORKERS, kind=request.param, uid=UID, RETOOL_SANDBOX_MAX_PROCESSES=str(MAX_PROCESSES), RETOOL_SANDBOX_MAX_OPEN_FILES=str(MAX_OPEN_FILES))
    running.baseline = running.readyz()  # type: ignore[attr-defined]
    yield running
    stop_server(running)


async def run(client: httpx.AsyncClient, code: str, *, timeout: float = 90, memory_mb: int = 256) -> dict:
    """One execution's answer (the unaccounted-memory suite's request, with this suite's longer run bound)."""
    return await run_code(client, code, timeout=timeout, memory_mb=memory_mb)


def assert_unharmed(pod: RunningServer) -> None:
    now = pod.readyz()
    assert now["live_workers"] == pod.workers and now["worker_restarts"] == pod.baseline["worker_restarts"], now  # type: ignore[attr-defined]


# ---------------------------------------------------------------- 1. memory hidden under the baseline

STUB = (
    "4889fb4c8b234c8d6b084d85e47418498b7d00498b7508b80b0000000f054983c51049ffccebe3498b75004989f631ffba0300000041ba22000000"
    "49c7c0ffffffff4531c9b8090000000f054889c7c607014881c7001000004981ee0010000077edb8220000000f05ebf7"
)
"""x86-64, called with a table ``[n, (address, length) * n, fresh]``: munmap each region, mmap ``fresh``
bytes of anonymous memory and touch every page, then ``pause()`` for ever. Raw syscalls only, so it
runs with nothing of the interpreter (or the C library) left mapped:

    mov rbx, rdi; mov r12, [rbx]; lea r13, [rbx+8]
    unmap: test r12, r12; jz fresh; mov rdi, [r13]; mov rsi, [r13+8]; mov eax, 11; syscall
           add r13, 16; dec r12; jmp unmap
    fresh: mov rsi, [r13]; mov r14, rsi; xor edi, edi; mov edx, 3; mov r10d, 0x22; mov r8, -1
           xor r9d, r9d; mov eax, 9; syscall; mov rdi, rax
    touch: mov byte [rdi], 1; add rdi, 4096; sub r14, 4096; ja touch
    hold:  mov eax, 34; syscall; jmp hold
"""

HIDE_UNDER_THE_BASELINE = """
import ctypes, math, mmap, os, struct, time

def resident_kib(pid):
    text = open(f"/proc/{{pid}}/status").read()
    return sum(int(line.split()[1]) for line in text.splitlines() if line.startswith(("RssAnon:", "RssShmem:")))

def hide_and_hold(fresh):
    # Keep only this area (the code and its table) and the stack: everything inherited goes.
    area = mmap.mmap(-1, 1 << 18, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    regions = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if base <= start < base + (1 << 18) or (len(fields) > 5 and fields[5] in ("[stack]", "[vsyscall]")):
            continue
        regions.append((start, end - start))
    table = struct.pack(f"<{{2 + 2 * len(regions)}}Q", len(regions), *[x for r in regions for x in r], fresh)
    area[: len(STUB)] = STUB
    area[4096 : 4096 + len(table)] = table
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(base)(base + 4096)  # never returns

STUB = bytes.fromhex({stub!r})
baseline = resident_kib("self")  # a fresh fork of the warm interpreter: about the watch's baseline
fresh = (baseline - 8 * 1024) * 1024  # each child's memory stays under the baseline
children = min({most}, math.ceil({total_mb} * 2**20 / fresh))
pids = []
for _ in range(children):
    pid = os.fork()
    if pid == 0:
        hide_and_hold(fresh)
    pids.append(pid)
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not all(resident_kib(pid) * 1024 >= 0.9 * fresh for pid in pids):
    time.sleep(0.01)
held = sum(resident_kib(pid) for pid in pids) // 1024
time.sleep(20)  # hold it: the watch ends the execution within its ticks; only a watch that misses it lets this print
print(f"held {{held}} MB in {{children}} children, each under the {{baseline // 1024}} MB baseline")
"""


async def test_forks_that_unmap_what_they_inherited_count_against_the_memory_limit(pod: RunningServer) -> None:
    """Each child unmaps everything it inherited, maps fresh memory just under the warm baseline and
    keeps it; together ~250 MB at memory_limit_MB=64. Before the fix each counted 0 and the
    execution returned Success holding it all (30 such children held ~1.9 GB); now it ends with the
    memory-limit outcome."""
    if platform.machine() != "x86_64":
        pytest.skip("the attack's machine code is x86-64")
    code = HIDE_UNDER_THE_BASELINE.format(stub=STUB, most=MAX_PROCESSES - 2, total_mb=240)
    async with httpx.AsyncClient(base_url=pod.url) as client:
        answers = [await run(client, code, memory_mb=64) for _ in range(2)]  # at once, they would share RLIMIT_NPROC's room
    for answer in answers:
        assert answer["status"] == "Failed" and "held" not in out(answer), (out(answer), err(answer))
        assert answer["run_result"]["return_code"] == -9 and "over memory_limit_MB=64" in err(answer), err(answer)
    assert_unharmed(pod)


# ---------------------------------------------------------------- 2. processes leapfrogging the uid's count

UP, GO, STARTED = "children-up", "go", "started"
HELD_CHILDREN = MAX_PROCESSES // 2

HOLDER = f"""
import os, time
r, w = os.pipe()
for _ in range({HELD_CHILDREN}):  # within MAX_PROCESSES, and within the uid's room with the server's threads
    if os.fork() == 0:
        os.close(w)
        os.read(r, 1)  # until the pipe closes
        os._exit(0)
os.close(r)
open({UP!r}, "w").write("up")
deadline = time.monotonic() + 60
while not os.path.exists({GO!r}) and time.monotonic() < deadline:
    time.sleep(0.02)
os.close(w)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print("released")
"""
"""Holds processes (fewer than MAX_PROCESSES) until the test releases it: they are in the replica's
count when the next execution is dispatched, and leave right after. Not MAX_PROCESSES: the uid's
limit given at dispatch leaves an execution MAX_PROCESSES less the server's threads (docs/sandbox.md)."""

LEAPFROG = f"""
import os, time
open({STARTED!r}, "w").write("started")
r, w = os.pipe()
started = 0
deadline = time.monotonic() + 8
while started < {3 * MAX_PROCESSES} and time.monotonic() < deadline:
    try:
        pid = os.fork()
    except BlockingIOError:  # RLIMIT_NPROC: wait for the uid's other processes to leave
        time.sleep(0.01)
        continue
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    started += 1
print(f"held {{1 + started}} tasks")
"""
"""Starts as many processes as the uid's RLIMIT_NPROC lets it, retrying while the processes
counted at its dispatch leave, and holds them."""


def directories_with(pod: RunningServer, marker: str) -> list[str]:
    """The execution directories of the replica that hold ``marker``, as this process reaches them."""
    found: dict[str, str] = {}
    for pid in descendants(pod.pid):
        with contextlib.suppress(OSError):  # gone since the listing
            if os.path.exists(f"/proc/{pid}/cwd/{marker}"):
                inside = os.readlink(f"/proc/{pid}/cwd")
                found.setdefault(inside, f"/proc/{pid}/root{inside}")
    return list(found.values())


async def test_an_execution_cannot_take_the_room_other_executions_processes_leave(pod: RunningServer) -> None:
    """Two executions hold processes while a third is dispatched (the replica's count it is given
    includes them), then leave: before the fix the third went on to hold ~2x MAX_PROCESSES tasks (15 of 8)
    and returned Success; now it is ended past MAX_PROCESSES of its own."""
    if pod.kind != "pod":
        pytest.skip("the leapfrog needs executions that share a uid; in this shape each has its own, and RLIMIT_NPROC counts only its processes")
    async with httpx.AsyncClient(base_url=pod.url) as client:
        holders = []
        for n in (1, 2):  # one after the other: each is given the count with the ones before it
            holder = asyncio.ensure_future(run(client, HOLDER))
            holders.append(holder)
            await until(lambda n=n, holder=holder: holder.done() or len(directories_with(pod, UP)) == n, what=f"holder {n} up", timeout_s=60)
            assert not holder.done(), (out(holder.result()), err(holder.result()))
        leapfrog = asyncio.ensure_future(run(client, LEAPFROG))
        await until(lambda: directories_with(pod, STARTED), what="the third execution started", timeout_s=60)
        for directory in directories_with(pod, UP):  # as root: the holders' directories are the replica's uid's
            Path(directory, GO).write_text("go")
        answers = await asyncio.gather(*holders)
        answer = await leapfrog
    for held in answers:
        assert held["status"] == "Success" and out(held) == "released\n", (out(held), err(held))
    assert answer["status"] == "Failed" and "held" not in out(answer), (out(answer), err(answer))
    assert answer["run_result"]["return_code"] == -9 and f"over the sandbox's limit of {MAX_PROCESSES} (MAX_PROCESSES)" in err(answer), err(answer)
    await until(lambda: pod.readyz()["busy_workers"] == 0, what="every worker idle again")
    assert_unharmed(pod)



def test_the_process_count_is_every_task_of_the_descendants_and_only_theirs() -> None:
    """What the watch compares with MAX_PROCESSES (``accounting.tree``): the tasks of every
    descendant, threads included, as RLIMIT_NPROC and pids.max count them; not the root's own."""
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:  # the root: one descendant with three more threads, all blocked until EOF
        os.close(w)
        if os.fork() == 0:
            import threading

            readers = [threading.Thread(target=os.read, args=(r, 1)) for _ in range(3)]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
            os._exit(0)
        os.wait()
        os._exit(0)
    os.close(r)
    try:
        wait_until(lambda: accounting.tree(parent)[1] == 4, what="a descendant with three more threads: 4 tasks", timeout_s=10)
        pids, tasks = accounting.tree(parent)
        assert len(pids) == 1 and tasks == 4, (pids, tasks)
    finally:
        os.close(w)
        os.waitpid(parent, 0)


# ---------------------------------------------------------------- 3. memory parked in pipes

FILL_PIPES = """
import os, time
pipes = []
while len(pipes) < {most}:
    try:
        r, w = os.pipe()
    except OSError:  # RLIMIT_NOFILE
        break
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    pipes.append((r, w))
time.sleep({hold_s})  # hold it: only a watch that does not count pipes lets this print
print(f"held {{len(pipes)}} full pipes")
"""
"""Fills as many pipes as the descriptor limit allows (or ``most``) and keeps them: kernel memory, each
pipe up to its 64 KiB default capacity, that no resident size shows (issue 49: several processes
doing this held 150-175 MB per execution)."""


async def test_memory_parked_in_pipes_counts_against_the_memory_limit(pod: RunningServer) -> None:
    """~500 full pipes (RLIMIT_NOFILE 1024): ~32 MB of kernel memory, within the uid's
    pipe-user-pages-soft (64 MiB) so each is full size, at memory_limit_MB=16. Before pipes were
    counted the execution returned Success holding it; now it ends with the memory-limit outcome,
    which names the pipes. A program with a few full pipes stays within the limit."""
    async with httpx.AsyncClient(base_url=pod.url) as client:
        answer = await run(client, FILL_PIPES.format(most=10_000, hold_s=20), memory_mb=16)
        few = await run(client, FILL_PIPES.format(most=8, hold_s=0.5), memory_mb=16)
    assert answer["status"] == "Failed" and "held" not in out(answer), (out(answer), err(answer))
    assert answer["run_result"]["return_code"] == -9, err(answer)
    assert re.search(r"used \d+ MB \(\d+ MB of it for \d+ open pipes\), over memory_limit_MB=16", err(answer)), err(answer)
    assert few["status"] == "Success" and out(few) == "held 8 full pipes\n", (out(few), err(few))
    assert_unharmed(pod)


def test_a_pipe_counts_once_however_many_processes_hold_its_ends() -> None:
    before = accounting.open_pipes([os.getpid()])
    pipes = [os.pipe() for _ in range(3)]
    ends = [fd for pair in pipes for fd in pair]
    child = subprocess.Popen(["sleep", "30"], pass_fds=ends)  # both ends of each, in a second process
    try:
        assert accounting.open_pipes([os.getpid()]) == before + 3
        assert accounting.open_pipes([child.pid]) >= 3
        # The child holds only what it inherited from this process: together, nothing more.
        assert accounting.open_pipes([os.getpid(), child.pid]) == before + 3
        assert accounting.open_pipes([2**22 + 1]) == 0, "a pid that is gone counts nothing"
    finally:
        child.kill()
        child.wait()
        for fd in ends:
            os.close(fd)
