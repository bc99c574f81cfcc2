"""A memory and pids cgroup per execution (``retool.sandbox.cgroups``): where a replica finds its
cgroups (fake v1/v2 trees), what the kernel enforces in them (this machine's real cgroupfs: the tests
run as root and may make cgroups below their own), and the server using them for every execution."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retool.sandbox import cgroups, layers
from retool_operator.isolation import parse_readyz
from tests.sandbox.conftest import RunningServer, start_server, stop_server
from tests.sandbox.waiting import wait_until

V1_SELF = "12:pids:/\n11:memory:/jobs/a\n0::/\n"
V2_SELF = "0::/kubepods/pod1/c1\n"


def fake_v1(root: Path, *, pids: bool = True) -> Path:
    (root / "memory" / "jobs" / "a").mkdir(parents=True)
    if pids:
        (root / "pids").mkdir()
    return root


def fake_v2(root: Path, controllers: str) -> Path:
    own = root / "kubepods" / "pod1" / "c1"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.controllers").write_text(controllers + "\n")
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_SELF, {"pids": "/", "memory": "/jobs/a", "": "/"}),
        ("4:cpu,cpuacct:/x\n", {"cpu": "/x", "cpuacct": "/x"}),
        (V2_SELF, {"": "/kubepods/pod1/c1"}),
        ("garbage\n", {}),
    ],
)
def test_own_paths_reads_proc_self_cgroup(text: str, expected: dict[str, str]) -> None:
    assert cgroups.own_paths(text) == expected


def test_locate_v2_needs_memory_and_pids_in_the_own_cgroup(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "full", "cpu memory pids")
    assert cgroups.locate(V2_SELF, root) == cgroups.Layout(2, (root / "kubepods/pod1/c1",))
    assert cgroups.locate(V2_SELF, fake_v2(tmp_path / "no-memory", "cpu pids")) is None


def test_locate_v1_needs_both_hierarchies(tmp_path: Path) -> None:
    root = fake_v1(tmp_path / "both")
    assert cgroups.locate(V1_SELF, root) == cgroups.Layout(1, (root / "memory/jobs/a", root / "pids"))
    assert cgroups.locate(V1_SELF, fake_v1(tmp_path / "no-pids", pids=False)) is None
    assert cgroups.locate("0::/\n", tmp_path / "empty") is None


def test_limits_per_version_and_the_oom_counter() -> None:
    assert cgroups.limits(2, 1 << 30, 64) == {"memory.max": str(1 << 30), "memory.swap.max": "0", "memory.oom.group": "1", "pids.max": "64"}
    assert cgroups.limits(1, 1 << 30, 64)["memory.limit_in_bytes"] == str(1 << 30)
    assert cgroups.oom_kills("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n") == 2
    assert cgroups.oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n") == 5
    assert cgroups.oom_kills("oom_kill_disable 0\nunder_oom 0\n") == 0


def test_the_plan_reports_the_layers_only_with_a_cgroup_version() -> None:
    plan = layers.decide(layers.Probes(euid=0, uid_switch=True, namespaces="root-namespaces", private_proc=True, namespace_error=None, landlock_abi=6, seccomp_error=None))
    assert "memory-cgroup" not in layers.layers(plan)
    with_cgroups = layers.Plan.from_dict({**plan.as_dict(), "cgroup_version": 1, "cgroup_dirs": ["/a", "/b"]})
    assert with_cgroups.cgroup_dirs == ("/a", "/b")
    assert {"memory-cgroup", "pids-cgroup"} <= set(layers.layers(with_cgroups))
    assert layers.describe(with_cgroups)["cgroups"] == "v1"


@pytest.fixture(scope="module")
def subtree() -> Iterator[cgroups.Subtree]:
    layout = cgroups.locate(Path("/proc/self/cgroup").read_text())
    if layout is None:
        pytest.skip("this process has no memory and pids cgroup controllers")
    try:
        made = cgroups.Subtree.prepare(layout, os.getpid())
        made.probe()
    except cgroups.CgroupError as err:
        pytest.skip(f"this machine does not let the tests write their cgroup subtree: {err}")
    yield made
    made.remove()
    assert not any(Path(d).exists() for d in made.dirs) or made.version == 2


def _start_in(group: cgroups.Execution, code: str) -> subprocess.Popen:
    """``code`` in a new process that joins ``group`` before it runs anything (it waits for a byte)."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(1)\n" + code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group.attach(process.pid)
    assert process.stdin is not None
    process.stdin.write("x")
    process.stdin.close()
    return process


MEMFD_300_MB = """
import os, mmap
fd = os.memfd_create("hidden")
os.ftruncate(fd, 300 << 20)
m = mmap.mmap(fd, 300 << 20)
for i in range(0, 300 << 20, 4096):
    m[i] = 1
print("held")
"""


def test_the_kernel_kills_memory_no_process_shows_inside_the_executions_cgroup_only(subtree: cgroups.Subtree) -> None:
    group = subtree.execution("test-memfd", 100 << 20, 32)
    bystander = subtree.execution("test-bystander", 512 << 20, 32)
    try:
        calm = _start_in(bystander, "import time\nb = bytearray(50 << 20)\ntime.sleep(2)\nprint('calm', len(b))")
        hog = _start_in(group, MEMFD_300_MB)
        assert hog.wait(timeout=60) == -9 and "held" not in hog.stdout.read()  # type: ignore[union-attr]
        assert group.oom_kills() >= 1
        assert calm.wait(timeout=60) == 0 and calm.stdout.read().startswith("calm")  # type: ignore[union-attr]
        assert bystander.oom_kills() == 0
    finally:
        group.remove()
        bystander.remove()
    assert not any(d.exists() for d in group.dirs)


def test_a_fork_bomb_is_refused_at_pids_max_and_what_it_left_is_killed_on_removal(subtree: cgroups.Subtree) -> None:
    group = subtree.execution("test-bomb", 256 << 20, 16)
    bomb = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as err:
    print(n, err.errno)
"""
    process = _start_in(group, bomb)
    assert process.wait(timeout=60) == 0
    started = time.monotonic()
    group.remove()  # the sleeping children are still in it (and hold the output pipe open)
    assert not any(d.exists() for d in group.dirs) and time.monotonic() - started < cgroups.KILL_TIMEOUT_S
    forked, errno = process.stdout.read().split()  # type: ignore[union-attr]
    assert int(forked) < 16 and int(errno) == 11, (forked, errno)  # EAGAIN from the pids controller


@pytest.fixture(scope="module")
def root_server(subtree: cgroups.Subtree) -> Iterator[RunningServer]:
    running = start_server(2)
    yield running
    stop_server(running)


def _replica_subtrees(server: RunningServer) -> list[Path]:
    """The v1 subtrees of this replica, beside the server's own cgroups (no recursive walk of the
    hierarchy: other test processes' subtrees come and go meanwhile)."""
    own = cgroups.own_paths(Path(f"/proc/{server.pid}/cgroup").read_text())
    found = []
    for controller in ("memory", "pids"):
        base = Path("/sys/fs/cgroup", controller, own.get(controller, "/").lstrip("/"))
        with contextlib.suppress(FileNotFoundError):
            found += [base / name for name in os.listdir(base) if name.startswith(f"retool-sandbox-{server.pid}-")]
    return found


def _execution_cgroups(server: RunningServer) -> list[Path]:
    """The replica's execution cgroups now; one removed while we look is simply not listed."""
    found = []
    for mine in _replica_subtrees(server):
        with contextlib.suppress(FileNotFoundError):
            found += [child for child in mine.iterdir() if child.is_dir()]
    return found


FORKED_HOGS = """
import os, time
kids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        b = bytearray(100 << 20)  # each under the per-process RLIMIT_AS; together far over the limit
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("600 MB held")
"""


def test_a_root_replica_runs_every_execution_in_its_own_cgroup_and_removes_it(root_server: RunningServer) -> None:
    isolation = httpx.get(f"{root_server.url}/readyz", timeout=10).json()["isolation"]
    assert {"memory-cgroup", "pids-cgroup"} <= set(isolation["layers"]) and isolation["cgroups"] in ("v1", "v2"), isolation
    with httpx.Client(base_url=root_server.url, timeout=120) as client:
        hog = client.post("/run_code", json={"code": FORKED_HOGS, "run_timeout": 30, "memory_limit_MB": 128}).json()
        fine = client.post("/run_code", json={"code": "print(open('/proc/self/cgroup').read())", "run_timeout": 10, "memory_limit_MB": 128}).json()
    stderr = (hog["run_result"] or {}).get("stderr") or ""
    assert hog["status"] == "Failed" and "held" not in ((hog["run_result"] or {}).get("stdout") or "") and "memory_limit_MB=128" in stderr, hog
    assert fine["status"] == "Success", fine
    controller = "memory" if isolation["cgroups"] == "v1" else ""
    own = next(line.split(":", 2)[2] for line in fine["run_result"]["stdout"].splitlines() if line.split(":")[1:2] == [controller])
    assert re.search(r"/w\d+-[0-9a-f]{8}-\d+$", own), f"the execution runs in a cgroup of its own: {own}"
    if isolation["cgroups"] == "v1":
        # what is left is each worker's next pre-forked process, alone in its cgroup: the finished
        # executions' cgroups (and everything they started) are gone
        left = _execution_cgroups(root_server)
        assert len({group.name for group in left}) <= root_server.workers, left
        for group in left:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: nothing left in it either
                assert len((group / "cgroup.procs").read_text().split()) <= 1, group


def test_cgroups_off_is_reported_with_the_reason() -> None:
    running = start_server(1, RETOOL_SANDBOX_CGROUPS="off")
    try:
        isolation = httpx.get(f"{running.url}/readyz", timeout=10).json()["isolation"]
    finally:
        stop_server(running)
    assert "memory-cgroup" not in isolation["layers"] and isolation["cgroups"] is None
    assert "RETOOL_SANDBOX_CGROUPS=off" in isolation["cgroups_note"]


def test_two_replicas_with_the_same_pid_get_their_own_subtrees(subtree: cgroups.Subtree) -> None:
    """v1: the subtree was named from the server's pid (1 in every pod): two replicas sharing a
    hierarchy shared it, and one's shutdown emptied the other's. Now each gets its own."""
    if subtree.version != 1:
        pytest.skip("v2 uses the replica's own delegated cgroup")
    layout = cgroups.locate(Path("/proc/self/cgroup").read_text())
    assert layout is not None
    first, second = cgroups.Subtree.prepare(layout, 1), cgroups.Subtree.prepare(layout, 1)
    try:
        assert set(first.dirs).isdisjoint(second.dirs)
        group = second.execution("still-here", 64 << 20, 16)
        first.remove()
        assert all(directory.is_dir() for directory in (*second.dirs, *group.dirs))
    finally:
        second.remove()


def test_v1_swap_limit_and_the_order_of_writes_when_the_limit_moves(subtree: cgroups.Subtree) -> None:
    """v1 refuses memory.limit_in_bytes above memory.memsw.limit_in_bytes (EINVAL): growing writes
    memsw first, shrinking the limit first; the swap limit (memsw) equals the memory limit."""
    if subtree.version != 1 or not (subtree.dirs[0] / "memory.memsw.limit_in_bytes").exists():
        pytest.skip("needs cgroup v1 with swap accounting")
    group = subtree.execution("order", 64 << 20, 16)
    try:
        values = lambda: [int((group.dirs[0] / name).read_text()) for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")]  # noqa: E731
        assert values() == [64 << 20, 64 << 20]
        group.set_memory(256 << 20)
        assert values() == [256 << 20, 256 << 20]
        group.set_memory(32 << 20)
        assert values() == [32 << 20, 32 << 20]
        with pytest.raises(cgroups.CgroupError):  # what the wrong order meets: the kernel's refusal
            cgroups._write(group.dirs[0] / "memory.limit_in_bytes", str(128 << 20))
    finally:
        group.remove()


@pytest.mark.parametrize("mode", ["refuse", "run"])
def test_an_execution_cgroup_that_cannot_be_made_is_counted_and_refused_or_run(subtree: cgroups.Subtree, mode: str) -> None:
    """The cgroup layer used to fail open in silence. The replica's subtree is moved away (v1
    renames within a parent) so the next execution's cgroup cannot be made: /readyz and /metrics
    count it, and ``cgroup_failure`` decides whether the execution is refused or runs without."""
    if subtree.version != 1:
        pytest.skip("moves a v1 subtree")
    server = start_server(1, RETOOL_SANDBOX_CGROUP_FAILURE=mode)
    try:
        mine = _replica_subtrees(server)
        assert len(mine) == 2, mine
        # The worker says hello before it pre-forks: on a loaded machine the server is ready before the
        # pre-forked process has joined its cgroups, and moving the subtree then would refuse it too.
        joined = lambda path: any(child.is_dir() and (child / "cgroup.procs").read_text().strip() for child in path.iterdir())  # noqa: E731
        wait_until(lambda: all(joined(path) for path in mine), what="the pre-forked process in its execution cgroups")
        moved = [path.rename(path.with_name(path.name + "-moved")) for path in mine]
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                run = lambda: client.post("/run_code", json={"code": "print(7)", "run_timeout": 10}).json()  # noqa: E731
                assert run()["status"] == "Success"  # pre-forked before the move: in its cgroup
                answer = run()
        finally:
            for path, original in zip(moved, mine, strict=True):
                path.rename(original)
        if mode == "refuse":
            assert answer["status"] == "SandboxError" and "cgroup" in answer["message"], answer
        else:
            assert answer["status"] == "Success", answer
        report = server.readyz()
        assert report["cgroup_failures"] >= 1
        replica = parse_readyz("sandbox-0", report)  # what the operator puts in the run's status
        assert any("cgroup layer is degraded" in problem for problem in replica.problems), replica
        assert server.metric("retool_sandbox_cgroup_failures_total") >= 1
    finally:
        stop_server(server)
