"""The execution filter's denials added by issue 23, each tried in a child process that installed it.

Run directly against the kernel (no server): the child installs the filter exactly as an execution
does, makes one call, and reports its errno; the parent compares.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

import pytest

from retool.sandbox import seccomp

pytestmark = pytest.mark.skipif(not seccomp.supported(), reason="no seccomp filter for this architecture")

libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}[os.uname().machine]


def _errno_of(call: Callable[[], int]) -> int:
    """0 when ``call`` succeeded, else its errno (OSError or a C call returning -1)."""
    try:
        result = call()
    except OSError as exc:
        return exc.errno or -1
    return ctypes.get_errno() if isinstance(result, int) and result == -1 else 0


def under_filter(call: Callable[[int], int], *, protected: bool = False, signals_scoped: bool = True, deny_chmod: bool = False) -> int:
    """The errno ``call(parent)`` gets in a child confined like an execution (0: allowed)."""
    parent = os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            os.close(read_end)
            policy = seccomp.ExecutionPolicy(pid=os.getpid(), signals_scoped=signals_scoped, protected=(parent,) if protected else (), deny_chmod=deny_chmod)
            seccomp.confine(policy)
            os.write(write_end, str(_errno_of(lambda: call(parent))).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        answer = reader.read()
    os.waitpid(pid, 0)
    return int(answer)


def _tmpfile(_parent: int) -> int:
    fd = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    os.close(fd)
    return 0


def _named_file(_parent: int) -> int:
    fd = os.open("/proc/self/status", os.O_RDONLY)
    os.close(fd)
    return 0


CASES: dict[str, tuple[Callable[[int], int], int, bool]] = {
    "shmget is refused": (lambda _p: libc.shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0o600), errno.EPERM, False),
    "shmat is refused": (lambda _p: libc.shmat(0, None, 0), errno.EPERM, False),
    "msgget is refused": (lambda _p: libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600), errno.EPERM, False),
    "semget is refused": (lambda _p: libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600), errno.EPERM, False),
    "memfd_create is refused": (lambda _p: os.close(os.memfd_create("x")) or 0, errno.EPERM, False),
    "an O_TMPFILE open is refused": (_tmpfile, errno.EPERM, False),
    "a plain open is allowed": (_named_file, 0, False),
    "openat2 answers ENOSYS so libc falls back": (lambda _p: libc.syscall(SYS_OPENAT2, -100, b"/", None, 0), errno.ENOSYS, False),
    "setsid is refused": (lambda _p: os.setsid() or 0, errno.EPERM, False),
    "signalling the protected zygote is refused": (lambda p: os.kill(p, 0) or 0, errno.EPERM, True),
    "its process group too": (lambda p: os.killpg(p, 0) or 0, errno.EPERM, True),
    "and kill(-1)": (lambda _p: os.kill(-1, 0) or 0, errno.EPERM, True),
    "without protection the parent can be signalled": (lambda p: os.kill(p, 0) or 0, 0, False),
    "a protected child still signals itself": (lambda _p: os.kill(os.getpid(), 0) or 0, 0, True),
}


@pytest.mark.parametrize(("call", "expected", "protected"), CASES.values(), ids=CASES.keys())
def test_the_execution_filter(call: Callable[[int], int], expected: int, protected: bool) -> None:
    assert under_filter(call, protected=protected) == expected


def test_the_filter_still_fits_classic_bpf_jumps_on_every_architecture() -> None:
    for arch in seccomp.ARCHES:
        for policy in (seccomp.ExecutionPolicy(pid=7), seccomp.ExecutionPolicy(pid=7, signals_scoped=True, protected=(2,), deny_chmod=True)):
            assert len(seccomp.build_filter(arch, policy)) < 4096



DENIED = {
    # docs/sandbox.md's deny list, written out here: a call dropped from the module's lists still fails its case
    "always": (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp",
        "process_madvise", "process_mrelease", "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns",
        "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
        "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff", "reboot",
    ),
    "System V IPC": ("shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl", "semtimedop"),
    "memfd": ("memfd_create", "memfd_secret"),
    "sockets": ("socket", "socketpair", "connect"),
    "mode changes": ("chmod", "fchmod", "fchmodat", "fchmodat2", "setxattr", "lsetxattr", "fsetxattr"),
    "own session": ("setsid",),
}  # fmt: skip
NUMBERS = seccomp.ARCHES.get(os.uname().machine, (0, {}))[1]
NAMED = sorted({name for names in DENIED.values() for name in names if name in NUMBERS})


def test_the_modules_deny_lists_are_the_documented_ones() -> None:
    """A call added to a list gets a case here too (and the docs' list), never silently."""
    module = {*seccomp.ALWAYS_DENIED, *seccomp.SYSV_IPC, *seccomp.MEMFD, *seccomp.SOCKETS, *seccomp.CHMOD_FAMILY, "setsid"}
    assert module == {name for names in DENIED.values() for name in names}
libc.syscall.restype = ctypes.c_long


def _raw(name: str) -> Callable[[int], int]:
    """The call by number with every argument -1: a bad pointer, fd, flag or id for each of them, so
    the call is harmless even where nothing refused it (it then fails with EFAULT, EBADF, EINVAL...)."""
    return lambda _parent: libc.syscall(ctypes.c_long(NUMBERS[name]), *[ctypes.c_long(-1)] * 6)


@pytest.mark.parametrize("name", NAMED)
def test_each_call_on_the_deny_lists_is_refused_by_the_kernel(name: str) -> None:
    """Every call named on a deny list, made by number in a confined child: EPERM, from the filter
    (its bad arguments would give any other errno had the call reached the kernel's handler)."""
    assert under_filter(_raw(name), deny_chmod=True) == errno.EPERM


def test_the_deny_list_calls_fail_otherwise_without_eperm() -> None:
    """The check above can fail: unconfined, the same calls give other errnos (as root, bad arguments)."""
    if os.geteuid() != 0:
        pytest.skip("root sees the argument errors rather than missing privileges")
    sample = [name for name in ("userfaultfd", "memfd_secret", "socketpair", "connect", "fchmod", "keyctl") if name in NUMBERS]
    for name in sample:
        assert _errno_of(lambda name=name: _raw(name)(0)) not in (0, errno.EPERM), name


def test_tiocsti_cannot_push_input_into_a_terminal() -> None:
    """TIOCSTI on the execution's stdin would type commands into whatever terminal it is."""
    import fcntl
    import termios

    master, slave = os.openpty()
    try:
        outcome = under_filter(lambda _parent: fcntl.ioctl(slave, termios.TIOCSTI, b"x"))
        assert outcome == errno.EPERM
    finally:
        os.close(master)
        os.close(slave)


def test_a_pipe_buffer_cannot_be_grown() -> None:
    import fcntl

    r, w = os.pipe()
    try:
        assert under_filter(lambda _parent: fcntl.fcntl(w, 1031, 1 << 20)) == errno.EPERM
        assert under_filter(lambda _parent: fcntl.fcntl(w, 1032) * 0) == 0  # F_GETPIPE_SZ
    finally:
        os.close(r)
        os.close(w)
