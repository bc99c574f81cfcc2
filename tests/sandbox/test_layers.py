"""The isolation layers one by one: the decisions (pure, table-tested) and the kernel mechanisms
themselves, exercised in a forked process so a test never confines the test runner."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from retool.sandbox import accounting, isolation, landlock, layers, seccomp
from retool.sandbox.pool import RESTART_CAP_S, restart_delay
from retool.sandbox.worker import SYSTEM_READ_PATHS

# ---------------------------------------------------------------- seccomp, on a BPF interpreter

ALLOW, EPERM, ENOSYS = seccomp.SECCOMP_RET_ALLOW, seccomp.SECCOMP_RET_ERRNO | errno.EPERM, seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS


def run_bpf(program: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's classic-BPF seccomp interpreter returns for this syscall."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & 0xFFFFFFFFFFFFFFFF for a in (*args, 0, 0, 0, 0, 0, 0)[:6]])
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == seccomp.RET_K:
            return k
        else:
            taken = {seccomp.JEQ_K: acc == k, seccomp.JGE_K: acc >= k, seccomp.JSET_K: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)


P = 4242  # the execution's main process, as it sees itself
CASES: dict[str, tuple[str, tuple[int, ...], bool, int]] = {
    # name: (syscall, args, signals scoped, verdict)
    "kill of its own process group is allowed": ("kill", (0, 9), False, ALLOW),
    "kill of itself is allowed": ("kill", (P, 9), False, ALLOW),
    "kill of its process group by number is allowed": ("kill", (-P, 9), False, ALLOW),
    "kill(-1) is refused": ("kill", (-1, 9), False, EPERM),
    "kill of another pid is refused": ("kill", (P + 1, 9), False, EPERM),
    "kill of another pid with garbage in the high bits is still refused": ("kill", ((1 << 40) | (P + 1), 9), False, EPERM),
    "kill of another process group is refused": ("kill", (-(P + 7), 19), False, EPERM),
    "tgkill of its own threads is allowed": ("tgkill", (P, P + 3, 10), False, ALLOW),
    "tgkill of another thread group is refused": ("tgkill", (1, 1, 9), False, EPERM),
    "rt_sigqueueinfo to another pid is refused": ("rt_sigqueueinfo", (1, 9, 0), False, EPERM),
    "signals are left to Landlock's scope or the pid namespace when they confine them": ("kill", (P + 1, 9), True, ALLOW),
    "pidfd_send_signal (also takes /proc/<pid> fds) is refused": ("pidfd_send_signal", (5, 9, 0, 0), True, EPERM),
    "pidfd_open is refused": ("pidfd_open", (1, 0), True, EPERM),
    "ptrace is refused": ("ptrace", (16, 1), True, EPERM),
    "process_vm_readv is refused": ("process_vm_readv", (1,), True, EPERM),
    "prlimit64 on itself (setrlimit) is allowed": ("prlimit64", (0, 9), True, ALLOW),
    "prlimit64 on a sibling is refused": ("prlimit64", (P + 1, 9), True, EPERM),
    "setpriority of itself is allowed": ("setpriority", (0, 0, 5), True, ALLOW),
    "setpriority of every process of the uid is refused": ("setpriority", (2, 10001, 19), True, EPERM),
    "setpriority of another pid is refused": ("setpriority", (0, 1, 19), True, EPERM),
    "sched_setaffinity of another pid is refused": ("sched_setaffinity", (1, 8, 0), True, EPERM),
    "fcntl F_SETOWN (SIGIO to any pid) is refused": ("fcntl", (3, seccomp.F_SETOWN, 1), True, EPERM),
    "fcntl F_GETFL is allowed": ("fcntl", (3, 3), True, ALLOW),
    "ioctl FIOSETOWN is refused": ("ioctl", (3, seccomp.FIOSETOWN, 0), True, EPERM),
    "TCP/UDP sockets are refused": ("socket", (socket.AF_INET, socket.SOCK_STREAM, 0), True, EPERM),
    "IPv6 sockets are refused": ("socket", (socket.AF_INET6, socket.SOCK_DGRAM, 0), True, EPERM),
    "unix sockets are refused (kernel memory in their buffers, pathname egress)": ("socket", (socket.AF_UNIX, socket.SOCK_STREAM, 0), True, EPERM),
    "unix socket pairs are refused": ("socketpair", (socket.AF_UNIX, socket.SOCK_STREAM, 0, 0), True, EPERM),
    "connect is refused": ("connect", (3, 0, 110), True, EPERM),
    "fcntl F_SETPIPE_SZ (a bigger pipe buffer) is refused": ("fcntl", (3, seccomp.F_SETPIPE_SZ, 1 << 20), True, EPERM),
    "fcntl F_GETPIPE_SZ is allowed": ("fcntl", (3, 1032), True, ALLOW),
    "io_uring is refused": ("io_uring_setup", (8, 0), True, EPERM),
    "unshare is refused": ("unshare", (isolation.CLONE_NEWUSER,), True, EPERM),
    "clone with CLONE_NEWUSER is refused": ("clone", (isolation.CLONE_NEWUSER | signal.SIGCHLD,), True, EPERM),
    "a plain fork (clone) is allowed": ("clone", (0x01200011,), True, ALLOW),
    "clone3 answers ENOSYS so libc falls back to clone": ("clone3", (0, 88), True, ENOSYS),
    "bpf is refused": ("bpf", (0,), True, EPERM),
    "fchmodat is allowed while the filesystem is confined": ("fchmodat", (-100, 0, 0o777), True, ALLOW),
}


@pytest.mark.parametrize("arch", sorted(seccomp.ARCHES))
@pytest.mark.parametrize(("syscall", "args", "scoped", "verdict"), CASES.values(), ids=CASES.keys())
def test_execution_filter_verdicts(arch: str, syscall: str, args: tuple[int, ...], scoped: bool, verdict: int) -> None:
    audit_arch, numbers = seccomp.ARCHES[arch]
    program = seccomp.build_filter(arch, seccomp.ExecutionPolicy(pid=P, signals_scoped=scoped))
    assert run_bpf(program, numbers[syscall], audit_arch, args) == verdict


@pytest.mark.parametrize("arch", sorted(seccomp.ARCHES))
def test_chmod_by_path_is_refused_only_without_filesystem_confinement(arch: str) -> None:
    audit_arch, numbers = seccomp.ARCHES[arch]
    confined = seccomp.build_filter(arch, seccomp.ExecutionPolicy(pid=P))
    open_fs = seccomp.build_filter(arch, seccomp.ExecutionPolicy(pid=P, deny_chmod=True))
    assert run_bpf(confined, numbers["fchmodat"], audit_arch, (-100, 0, 0o755)) == ALLOW
    assert run_bpf(open_fs, numbers["fchmodat"], audit_arch, (-100, 0, 0o755)) == EPERM


@pytest.mark.parametrize(
    ("plan", "denied"),
    [
        (layers.Plan(namespaces=None, private_proc=False, uid_per_execution=False, landlock_abi=7, seccomp=True), True),
        (layers.Plan(namespaces="user-namespaces", private_proc=True, uid_per_execution=False, landlock_abi=7, seccomp=True), True),
        (layers.Plan(namespaces="root-namespaces", private_proc=True, uid_per_execution=True, landlock_abi=7, seccomp=True), False),
        (layers.Plan(namespaces=None, private_proc=False, uid_per_execution=True, landlock_abi=7, seccomp=True), False),
        (layers.Plan(namespaces=None, private_proc=False, uid_per_execution=True, landlock_abi=0, seccomp=True), True),
    ],
    ids=["restricted pod (one uid)", "user namespaces, one uid", "hostUsers false, uid each", "uid each with Landlock", "uid each, nothing confines the filesystem"],
)
def test_mode_changes_are_refused_wherever_executions_share_the_replica_uid(plan: layers.Plan, denied: bool) -> None:
    assert plan.deny_chmod is denied


def test_other_abis_cannot_go_around_the_filter() -> None:
    program = seccomp.build_filter("x86_64", seccomp.ExecutionPolicy(pid=P))
    x86_64, numbers = seccomp.ARCHES["x86_64"]
    assert run_bpf(program, 37, 0x40000003, (-1, 9)) == EPERM  # i386's kill via int 0x80
    assert run_bpf(program, numbers["kill"] | seccomp.X32_SYSCALL_BIT, x86_64, (-1, 9)) == EPERM  # x32
    assert run_bpf(program, 0, x86_64, (0,)) == ALLOW  # read


@pytest.mark.parametrize("arch", sorted(seccomp.ARCHES))
@pytest.mark.parametrize(
    "policy",
    [
        seccomp.ExecutionPolicy(pid=0),
        seccomp.ExecutionPolicy(pid=0, signals_scoped=True),
        seccomp.ExecutionPolicy(pid=0, signals_scoped=True, deny_chmod=True, protected=(7,)),
        seccomp.ExecutionPolicy(pid=0, deny_chmod=True, allow_memfd=True),
    ],
)
def test_a_prepared_filter_is_the_built_filter_of_each_pid(arch: str, policy: seccomp.ExecutionPolicy) -> None:
    """The zygote prepares the filter once; each execution patches in its pid: byte for byte the
    filter built for that pid, for pids on both sides of every constant the program holds."""
    prepared = seccomp.prepare(arch, policy)
    assert prepared.own_at and (prepared.group_at or policy.signals_scoped)
    for pid in (1, 2, 7, 62, 300, P, 32768, 4194304, 2**31 - 1):
        built = seccomp.build_filter(arch, seccomp.ExecutionPolicy(pid, policy.signals_scoped, policy.deny_chmod, policy.protected, policy.allow_memfd))
        assert prepared.render(pid) == seccomp.encode(built), pid


def test_namespace_denial_is_what_runtime_default_does_without_sys_admin() -> None:
    program = seccomp.build_namespace_denial("x86_64")
    arch, numbers = seccomp.ARCHES["x86_64"]
    assert run_bpf(program, numbers["unshare"], arch, (isolation.CLONE_NEWUSER,)) == EPERM
    assert run_bpf(program, numbers["clone"], arch, (isolation.CLONE_NEWPID | signal.SIGCHLD,)) == EPERM
    assert run_bpf(program, numbers["clone"], arch, (signal.SIGCHLD,)) == ALLOW
    assert run_bpf(program, numbers["kill"], arch, (-1, 9)) == ALLOW


# ---------------------------------------------------------------- the plan


def probes(**overrides: object) -> layers.Probes:
    base = {"euid": 10001, "uid_switch": False, "namespaces": None, "private_proc": False, "namespace_error": "EPERM", "landlock_abi": 7, "seccomp_error": None}
    return layers.Probes(**{**base, **overrides})  # type: ignore[arg-type]


PLANS = {
    "restricted pod on a 6.12+ kernel: Landlock and seccomp close everything": (probes(), {}, True, ["landlock-filesystem", "landlock-signal-scope", "seccomp", "scratch-dir"]),
    "restricted pod on a 6.8 kernel (ABI 4): seccomp guards signals": (probes(landlock_abi=4), {}, True, ["landlock-network", "seccomp"]),
    "restricted pod on 5.10 (no Landlock): the filesystem is open": (probes(landlock_abi=0), {}, False, ["seccomp", "scratch-sweep"]),
    "Landlock forced down to ABI 4 by configuration": (probes(), {"landlock_max_abi": 4}, True, ["landlock-network"]),
    "hostUsers false with the documented capabilities": (
        probes(euid=0, uid_switch=True, namespaces="root-namespaces", private_proc=True),
        {},
        True,
        ["uid-per-execution", "pid-namespace", "network-namespace", "mount-namespace", "private-proc", "scratch-tmpfs"],
    ),
    "user namespaces allowed, not root": (probes(namespaces="user-namespaces", private_proc=True), {}, True, ["user-namespace", "pid-namespace"]),
    "root without SYS_ADMIN: own uid per execution": (probes(euid=0, uid_switch=True, landlock_abi=0), {}, True, ["uid-per-execution", "seccomp", "scratch-sweep"]),
    "nothing but the rlimits (old kernel, seccomp off)": (probes(landlock_abi=0), {"seccomp": False}, False, ["scratch-sweep", "memory-watch"]),
    "namespaces turned off by configuration": (probes(namespaces="user-namespaces"), {"namespaces": "off"}, True, ["landlock-filesystem"]),
}


@pytest.mark.parametrize(("found", "settings", "strong", "expected_layers"), PLANS.values(), ids=PLANS.keys())
def test_plan(found: layers.Probes, settings: dict, strong: bool, expected_layers: list[str]) -> None:
    plan = layers.decide(found, **settings)
    described = layers.describe(plan)
    assert described["strong"] is strong, described
    assert set(expected_layers) <= set(described["layers"]), described["layers"]
    assert described["summary"].startswith("strong" if strong else "weak")
    assert bool(described["problems"]) or strong
    assert layers.Plan.from_dict(plan.as_dict()) == plan


def test_plan_explains_what_is_missing() -> None:
    plan = layers.decide(probes(landlock_abi=4))
    assert any("command lines" in problem for problem in plan.problems)  # one uid, no private /proc
    assert not any("command lines" in p for p in layers.decide(probes(namespaces="user-namespaces", private_proc=True)).problems)
    assert any("no signal scope" in problem for problem in plan.problems)
    assert plan.signals_scoped is False and plan.deny_chmod is True and plan.needs_sweep is False  # one uid: no mode changes
    weak = layers.decide(probes(landlock_abi=0))
    assert layers.guards(weak)["filesystem"] == [] and weak.deny_chmod and weak.needs_sweep


ROOT_ON_NODE = {
    "root in the node's user namespace (hostUsers: false dropped or ignored)": (probes(euid=0, uid_switch=True, host_userns=True), None, True),
    "root of a pod's own user namespace": (probes(euid=0, uid_switch=True, host_userns=False), None, False),
    "root under a sandboxing RuntimeClass (its own kernel)": (probes(euid=0, uid_switch=True, host_userns=True), "gvisor", False),
    "the non-root pod in the node's user namespace": (probes(host_userns=True), None, False),
}


@pytest.mark.parametrize(("found", "runtime_class", "flagged"), ROOT_ON_NODE.values(), ids=ROOT_ON_NODE.keys())
def test_a_root_server_outside_a_pod_user_namespace_is_reported(found: layers.Probes, runtime_class: str | None, flagged: bool) -> None:
    """The operator's user-namespace pods run as uid 0: where the cluster dropped or ignored hostUsers the
    replica says so; the executions' own isolation, and so ``strong``, does not change."""
    plan = layers.decide(found, runtime_class=runtime_class)
    described = layers.describe(plan)
    assert described["root_on_node"] is flagged
    assert any("root of the node" in p for p in plan.problems) is flagged
    in_pod_userns = layers.decide(layers.Probes(**{**found.as_dict(), "host_userns": False}), runtime_class=runtime_class)
    assert described["strong"] is layers.is_strong(in_pod_userns)
    assert layers.Probes.from_dict(found.as_dict()) == found
    assert layers.Plan.from_dict(plan.as_dict()) == plan


def test_the_uid_map_tells_the_nodes_user_namespace_from_a_pods() -> None:
    from retool.sandbox.template import in_initial_user_namespace

    with open("/proc/self/uid_map") as handle:
        here = handle.read().split()
    assert in_initial_user_namespace() is (here == ["0", "0", "4294967295"])
    inside = in_child(lambda: (isolation.enter_user_namespace(0), in_initial_user_namespace())[1])
    if isinstance(inside, str) and re.match(r"raised (PermissionError|OSError): \[Errno (1|28|87)\]", inside):
        pytest.skip(f"this kernel or its policy refuses a user namespace here: {inside}")  # EPERM, ENOSPC (the limit), EUSERS
    assert inside is False  # a user namespace maps a range, never the whole identity


@pytest.mark.parametrize(("failures", "low", "high"), [(0, 0, 0), (1, 0.04, 0.06), (2, 0.09, 0.11), (6, 1.5, 1.7), (40, RESTART_CAP_S, RESTART_CAP_S)])
def test_restart_backoff(failures: int, low: float, high: float) -> None:
    assert low <= restart_delay(failures) <= high


# ---------------------------------------------------------------- accounting


def test_memory_figures_are_read_from_proc_texts() -> None:
    status = "Name:\tpython\nVmRSS:\t 9000 kB\nRssAnon:\t  5000 kB\nRssFile:\t 3000 kB\nRssShmem:\t 1000 kB\n"
    rollup = "Rss: 9 kB\nPss_Anon:   700 kB\nPss_File: 5 kB\nPss_Shmem:  20 kB\n"
    assert accounting.parse_status_memory(status) == 6000
    # The kernel's own text: its resident set is anonymous + file + shared memory (VmRSS).
    for _ in range(3):  # the kernel reads its counters one by one: a page faulted in between can skew one text
        text = Path("/proc/self/status").read_text()
        fields = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines() if line.startswith(("VmRSS:", "RssFile:"))}
        if accounting.parse_status_memory(text) + fields["RssFile"] == fields["VmRSS"]:
            break
    else:
        raise AssertionError(f"RssAnon + RssShmem + RssFile != VmRSS in {text!r}")
    assert accounting.parse_rollup_memory(rollup) == 720
    assert accounting.estimate([6000, 1000, 9000], baseline_kib=2000) == 6000 + 1000 + 9000 - 2000  # one warm baseline, not one per process


HOLD_200_MB = "import sys\ndata = bytearray(200 << 20)\ndata[::4096] = b'x' * len(data[::4096])\nprint('held', flush=True)\nsys.stdin.read()\n"


@pytest.mark.parametrize("exits_before_the_exact_read", [False, True], ids=["still-running", "exited"])
def test_the_memory_watch_counts_what_each_process_holds_when_it_reads(exits_before_the_exact_read: bool) -> None:
    """A process seen over the limit by the cheap pass may exit before the exact read (short-lived
    children do): it then holds nothing, and the execution must not be ended for it."""
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", HOLD_200_MB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"

        passes: list[int] = []

        def inspect(read: Callable[[], int]) -> int:
            passes.append(len(passes) + 1)
            if exits_before_the_exact_read and len(passes) == 2:  # the first pass is the cheap one, the second the exact read
                child.kill()
                child.wait()
            return read()

        watch = accounting.MemoryWatch(limit_kib=100 * 1024, baseline_kib=0, inspect=inspect)
        over = watch.over([child.pid], now=1.0)
        assert passes == [1, 2], "the cheap pass saw the 200 MB over the limit and asked for the exact read"
        if exits_before_the_exact_read:
            assert over is None
        else:
            assert over is not None and over >= 200 * 1024
    finally:
        child.kill()
        child.wait()


def test_the_exact_read_and_the_pipe_count_keep_their_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the limit by the cheap bound, the exact read (smaps_rollup) comes at most every
    ``exact_every_s``, and the pipe walk on the same cadence; between them the last figures stand."""
    import subprocess

    walks: list[float] = []
    real_open_pipes = accounting.open_pipes
    monkeypatch.setattr(accounting, "open_pipes", lambda pids: walks.append(1.0) or real_open_pipes(pids))
    child = subprocess.Popen([sys.executable, "-c", HOLD_200_MB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        passes: list[str] = []

        def inspect(read: Callable[[], int]) -> int:
            passes.append(read.__name__)
            return read()

        watch = accounting.MemoryWatch(limit_kib=100 * 1024, baseline_kib=0, inspect=inspect, exact_every_s=0.1, exact_cost_factor=0.0)
        assert watch.over([child.pid], now=1.0) is not None
        assert passes == ["cheap_pass", "read"] and len(walks) == 1
        assert watch.over([child.pid], now=1.05) is None, "within the interval the exact read waits"
        assert passes[2:] == ["cheap_pass"] and len(walks) == 1
        assert watch.over([child.pid], now=1.11) is not None
        assert passes[3:] == ["cheap_pass", "read"] and len(walks) == 2
        assert watch.pipes_kib >= 2 * accounting.PIPE_CHARGE_KIB, "the child's stdin and stdout pipes"
    finally:
        child.kill()
        child.wait()


def test_directory_usage_and_sweep(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 10000)
    (tmp_path / "g").write_bytes(b"y")
    used, entries = accounting.directory_usage(str(tmp_path), 100)
    assert used >= 10000 and entries == 3
    keep = tmp_path / "replica"
    keep.mkdir()
    os.symlink("/etc", tmp_path / "link")
    now = time.time() + 5
    removed = accounting.sweep([str(tmp_path)], {os.getuid()}, now, [str(keep)])
    assert sorted(Path(p).name for p in removed) == ["d", "g", "link"] and keep.exists() and Path("/etc/hostname").exists()
    assert accounting.sweep([str(tmp_path)], {os.getuid()}, 0.0, []) == []  # nothing older than a running execution


# ---------------------------------------------------------------- the kernel, in a forked process


def in_child(body: Callable[..., object], *, channel: bool = False) -> object:
    """Run ``body`` in a forked process; its return value (or exception text) comes back. With
    ``channel`` it is given the descriptor that carries it back (to keep it open)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            outcome = repr(body(write_end) if channel else body())
        except BaseException as exc:
            outcome = repr(f"raised {type(exc).__name__}: {exc}")
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    os.waitpid(pid, 0)
    import ast

    return ast.literal_eval(text)


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


KERNEL_ABI = landlock.kernel_abi()


@pytest.mark.parametrize("abi", [a for a in (1, 4, 6, 7) if a <= KERNEL_ABI])
def test_landlock_confines_an_execution_to_its_directory(tmp_path: Path, abi: int) -> None:
    mine, sibling = tmp_path / "mine", tmp_path / "sibling"
    mine.mkdir()
    sibling.mkdir()
    (sibling / "answer.txt").write_text("42")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def confined() -> dict[str, str]:
        read = landlock.read_paths([*SYSTEM_READ_PATHS, sys.base_prefix, sys.prefix, *sys.path], keep_out=[str(tmp_path)])
        landlock.restrict_self(landlock.Policy(read=read, write=(str(mine),)), abi)
        return {
            "own file": _attempt(lambda: (mine / "x").write_text("ok")),
            "system file": _attempt(lambda: open("/etc/hostname").read()),
            "sibling read": _attempt(lambda: (sibling / "answer.txt").read_text()),
            "sibling write": _attempt(lambda: (sibling / "answer.txt").write_text("0")),
            "list the scratch root": _attempt(lambda: os.listdir(tmp_path)),
            "loopback TCP": _attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close()),
            "signal the parent": _attempt(lambda: os.kill(os.getppid(), 0)),
        }

    outcome = in_child(confined)
    listener.close()
    assert outcome["own file"] == "ok" and outcome["system file"] == "ok"
    assert outcome["sibling read"] == outcome["sibling write"] == outcome["list the scratch root"] == "EACCES"
    assert outcome["loopback TCP"] == ("EACCES" if abi >= 4 else "ok")
    assert outcome["signal the parent"] == ("EPERM" if abi >= 6 else "ok")
    assert (sibling / "answer.txt").read_text() == "42"


def test_landlock_rules_prepared_once_confine_each_process_and_leave_no_descriptor(tmp_path: Path) -> None:
    """What the zygote does: the read and device rules opened and encoded once, before forking;
    each execution adds its own directory, restricts itself and closes the inherited paths."""
    if KERNEL_ABI < 1:
        pytest.skip("no Landlock in this kernel")
    read = landlock.read_paths([*SYSTEM_READ_PATHS, sys.base_prefix, sys.prefix, *sys.path], keep_out=[str(tmp_path)])
    prepared = landlock.prepare(read, KERNEL_ABI)
    try:
        for name in ("first", "second"):
            mine, other = tmp_path / name, tmp_path / f"{name}-other"
            mine.mkdir()
            other.mkdir()

            def confined(mine: Path = mine, other: Path = other) -> dict[str, object]:
                prepared.restrict_self(write=(str(mine),))
                prepared.close()
                return {
                    "own file": _attempt(lambda: (mine / "x").write_text("ok")),
                    "system file": _attempt(lambda: open("/etc/hostname").read()),
                    "/dev/null": _attempt(lambda: open("/dev/null", "w").write("x")),
                    "other directory": _attempt(lambda: (other / "x").write_text("no")),
                    "prepared paths still open": [fd for fd in prepared.fds if _attempt(lambda fd=fd: os.fstat(fd)) == "ok"],
                }

            assert in_child(confined) == {
                "own file": "ok",
                "system file": "ok",
                "/dev/null": "ok",
                "other directory": "EACCES",
                "prepared paths still open": [],
            }
        assert all(os.fstat(fd) for fd in prepared.fds)  # the preparing process keeps them for the next fork
    finally:
        prepared.close()


def test_seccomp_filter_holds_in_a_real_process() -> None:
    def confined() -> dict[str, str]:
        seccomp.confine(seccomp.ExecutionPolicy(pid=os.getpid()))
        import threading

        thread = threading.Thread(target=lambda: None)
        outcome = {
            "kill(-1)": _attempt(lambda: os.kill(-1, 0)),
            "kill itself": _attempt(lambda: os.kill(os.getpid(), 0)),
            "kill the parent": _attempt(lambda: os.kill(os.getppid(), 0)),
            "lower the parent's limits": _attempt(lambda: __import__("resource").prlimit(os.getppid(), __import__("resource").RLIMIT_NOFILE, (16, 16))),
            "inet socket": _attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
            "unix socket pair": _attempt(lambda: [s.close() for s in socket.socketpair()]),
            "pidfd_open": _attempt(lambda: os.pidfd_open(os.getppid())),
            "unshare": _attempt(lambda: isolation.unshare(isolation.CLONE_NEWUSER)),
            "thread": _attempt(lambda: (thread.start(), thread.join())),
            "fork": _attempt(_fork_and_wait),
        }
        return outcome

    outcome = in_child(confined)
    assert outcome == {
        "kill(-1)": "EPERM",
        "kill itself": "ok",
        "kill the parent": "EPERM",
        "lower the parent's limits": "EPERM",
        "inet socket": "EPERM",
        "unix socket pair": "EPERM",
        "pidfd_open": "EPERM",
        "unshare": "EPERM",
        "thread": "ok",
        "fork": "ok",
    }


def _fork_and_wait() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="maps another uid range: needs root")
def test_entering_a_user_namespace_maps_ids_and_rearms_the_parent_death_signal() -> None:
    import ctypes

    def inside() -> tuple[int, str, int]:
        isolation.set_dumpable(False)  # as the template is: the map files must still be writable
        isolation.enter_user_namespace(0)
        value = ctypes.c_int()
        isolation._libc.prctl(2, ctypes.addressof(value), 0, 0, 0)  # PR_GET_PDEATHSIG
        return os.getuid(), open("/proc/self/uid_map").read().split(), value.value

    uid, uid_map, pdeathsig = in_child(inside)  # type: ignore[misc]
    assert (uid, uid_map, pdeathsig) == (0, ["0", "0", "1"], signal.SIGKILL)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _closed_in_child(close_range: Callable[[], object], before: Callable[[], None] = lambda: None) -> dict[str, object]:
    """What an execution does first, in a forked process: close everything inherited but its own
    descriptors (here 4 of 9, one high, and the pipe this result comes back on)."""
    from retool.sandbox import child

    def body(channel: int) -> dict[str, object]:
        before()
        held = [os.open("/dev/null", os.O_RDONLY) for _ in range(8)]
        high = os.dup2(held[0], 4000)
        keep = {held[1], held[4], high, channel}
        chosen = close_range()
        child._close_other_fds(keep, chosen)  # type: ignore[arg-type]
        listing = sorted(int(name) for name in os.listdir("/proc/self/fd"))
        return {"probe": chosen is not None, "open": [fd for fd in listing if fd > 2 and _is_open(fd)], "kept": sorted(keep)}  # listdir's own is gone

    outcome = in_child(body, channel=True)
    assert isinstance(outcome, dict), outcome
    return outcome


def test_an_execution_closes_every_inherited_descriptor_but_its_own_with_or_without_close_range() -> None:
    """``close_range`` where the zygote's probe found it answers, the /proc walk otherwise: the same
    descriptors are left."""
    from retool.sandbox import child

    if child.CloseRange.probe() is None:
        pytest.skip("this kernel or runtime has no close_range (Linux >= 5.9)")
    for close_range, probed in ((child.CloseRange.probe, True), (lambda: None, False)):
        outcome = _closed_in_child(close_range)
        assert outcome.get("probe") is probed and outcome["open"] == outcome["kept"], outcome


def _refuse_close_range() -> None:
    """A seccomp filter that answers ENOSYS to close_range (as a runtime without it does) and allows the rest."""
    from retool.sandbox import child

    errno_ret, allow = 0x00050000 | errno.ENOSYS, 0x7FFF0000
    program = [
        (0x20, 0, 0, 0),  # ld [0]: the syscall number
        (0x15, 0, 1, child.CloseRange.NUMBER),  # jeq close_range
        (0x06, 0, 0, errno_ret),
        (0x06, 0, 0, allow),
    ]
    seccomp.install_encoded(b"".join(struct.pack("=HBBI", *insn) for insn in program))


def test_where_close_range_is_refused_the_probe_says_so_and_the_walk_closes_everything() -> None:
    """os.closerange would fall back to a million close() calls there; the probe picks the /proc walk."""
    from retool.sandbox import child

    outcome = _closed_in_child(child.CloseRange.probe, before=_refuse_close_range)
    assert outcome.get("probe") is False and outcome["open"] == outcome["kept"], outcome
