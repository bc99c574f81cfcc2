"""The seccomp filter of every execution: no way to reach another process, the network or the kernel's
riskier corners, whatever the uid.

seccomp sees syscall numbers and integer arguments only, never a process's ancestry, so the policy
is written in what it can enforce. An execution is its main process ``P`` (pid as the execution sees
it), its process group ``-P`` (it leads its own session, and process groups never cross sessions)
and ``0`` ("myself" / "my group"):

- every call that reaches into another process by pid (ptrace, process_vm_readv/writev, pidfd_open,
  pidfd_getfd, pidfd_send_signal — which also takes a ``/proc/<pid>`` directory fd — kcmp,
  process_madvise) is refused outright; the runtime never needs them;
- signals (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo) may target only ``0``, ``P``
  and ``-P``, unless something else already confines them to the execution's own processes (a pid
  namespace, or Landlock's signal scope): then they are allowed, so code can still stop its own
  children by pid. ``F_SETOWN``/``F_SETSIG`` and ``FIOSETOWN``/``SIOCSPGRP`` (signals delivered by
  the kernel on I/O, to a pid chosen by the caller) are refused;
- calls that change another process by pid (prlimit64, sched_setaffinity/-scheduler/-param/-attr,
  setpriority, ioprio_set, migrate_pages, move_pages) may target only ``0`` and ``P``: a sibling's
  memory limit or priority is not the execution's to change;
- no sockets at all (``socket``, ``socketpair``, ``connect``): no TCP/UDP, loopback included (the
  server's own port), no raw or netlink sockets, no unix sockets (kernel memory parked in their
  buffers, pathname sockets outside the execution's directory); io_uring (which could open sockets
  behind seccomp's back) is refused; a pipe's buffer cannot be grown (``F_SETPIPE_SZ``): pipes stay
  at the kernel's default size, and past the uid's ``pipe-user-pages-soft`` at two pages;
- no new namespaces (unshare, setns, clone with ``CLONE_NEW*``; clone3 answers ENOSYS so libc falls
  back to clone), no mounts, no bpf, perf_event_open, userfaultfd, keyrings, modules or kexec;
- wherever an execution shares the replica's uid, or nothing confines the filesystem, every call
  that changes a mode (chmod, fchmod, fchmodat, fchmodat2, the set-xattr calls that write ACLs) is
  refused: code can neither lock the replica out of its own scratch root nor make it listable.

Calls from another architecture (the i386 ABI on x86_64) and x32 calls are refused. Filters cannot
be removed and are inherited by every child of the execution.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass, replace

from retool.sandbox.isolation import _check, _libc, no_new_privs

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

# Classic BPF opcodes.
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K

# struct seccomp_data offsets (little-endian: the low 32 bits of an argument come first).
NR, ARCH = 0, 4


def arg(index: int) -> int:
    return 16 + 8 * index


X32_SYSCALL_BIT = 0x40000000
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME."""

AF_UNIX = 1
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
F_SETPIPE_SZ = 1031
FIOSETOWN, SIOCSPGRP, TIOCSTI = 0x8901, 0x8902, 0x5412
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1

# Syscall numbers of the architectures sandbox images are built for: (x86_64, aarch64), None where
# the architecture has no such call (aarch64 has no chmod, only fchmodat).
_SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "kcmp": (312, 272), "process_madvise": (440, 440), "process_mrelease": (448, 448),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "unshare": (272, 97), "setns": (308, 268), "clone": (56, 220), "clone3": (435, 435),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442), "open_by_handle_at": (304, 265),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "prlimit64": (302, 261), "sched_setaffinity": (203, 122), "sched_setscheduler": (144, 119), "sched_setparam": (142, 118), "sched_setattr": (314, 274),
    "migrate_pages": (256, 238), "move_pages": (279, 239), "setpriority": (141, 140), "ioprio_set": (251, 30),
    "fcntl": (72, 25), "ioctl": (16, 29), "socket": (41, 198), "chmod": (90, None), "fchmodat": (268, 53), "fchmodat2": (452, 452),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188),
    "msgctl": (71, 187), "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "open": (2, None), "openat": (257, 56), "openat2": (437, 437),
    "setsid": (112, 157), "fchmod": (91, 52), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "socketpair": (53, 199), "connect": (42, 203),
}  # fmt: skip


def _numbers(column: int) -> dict[str, int]:
    return {name: numbers[column] for name, numbers in _SYSCALLS.items() if numbers[column] is not None}


ARCHES: dict[str, tuple[int, dict[str, int]]] = {"x86_64": (0xC000003E, _numbers(0)), "aarch64": (0xC00000B7, _numbers(1))}
"""Architecture -> (its audit arch, syscall name -> number)."""

ALWAYS_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp",
    "process_madvise", "process_mrelease", "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff", "reboot",
)  # fmt: skip
SIGNAL_TO_PROCESS = ("kill", "rt_sigqueueinfo")  # arg0: pid, 0 (own group), -pgid
SIGNAL_TO_THREAD = ("tgkill", "rt_tgsigqueueinfo", "tkill")  # arg0: the thread group (tkill: the thread)
SYSV_IPC = ("shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl", "semtimedop")
"""System V IPC objects are not tied to any process: they outlive the execution, hold memory no
process's accounting shows, and a later execution could attach them. (x86_64 and aarch64 have no
``ipc`` multiplexer; the i386 ABI that has one is refused whole.)"""
MEMFD = ("memfd_create", "memfd_secret")
"""Anonymous files whose pages no process's resident memory shows until mapped: refused where no
memory cgroup of the execution counts them."""
O_TMPFILE_BIT = 0o20000000
"""``__O_TMPFILE``: an unnamed file in the scratch directory, invisible to the disk watch."""
OPEN_FLAGS = {"open": 1, "openat": 2}
"""Where the flags are, by call (openat2 keeps them in a struct seccomp cannot read: ENOSYS, so libc falls back)."""
PID_TARGETED = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages", "move_pages")
CHMOD_FAMILY = ("chmod", "fchmod", "fchmodat", "fchmodat2", "setxattr", "lsetxattr", "fsetxattr")
"""Every call that changes a file's mode (a POSIX ACL written as an extended attribute changes it
too). Landlock does not govern them: an execution sharing the replica's uid owns its directory and
the replica's scratch root, and a mode of 000 on either breaks every later worker's setup."""
SOCKETS = ("socket", "socketpair", "connect")
"""No sockets at all: AF_INET and the rest reach the network; AF_UNIX pairs park kernel memory in
their buffers that no RSS sample sees (bounded only by processes x open files x wmem_default), and
a pathname ``connect`` reaches any listener on the pod's filesystem, which Landlock (up to ABI 7)
does not cover."""


@dataclass(frozen=True)
class ExecutionPolicy:
    """What the filter of one execution allows.

    ``pid``: the execution's main process as it sees itself; ``signals_scoped``: a pid namespace or
    Landlock's signal scope already keeps signals inside the execution; ``deny_chmod``: nothing
    confines the filesystem, so the scratch directory's permissions must not be changed back.
    """

    pid: int
    signals_scoped: bool = False
    deny_chmod: bool = False
    protected: tuple[int, ...] = ()
    """Pids no signal may reach even where signals are otherwise scoped (the zygote, in a pid
    namespace where executions share its uid); ``kill(-1)`` is then refused too."""
    allow_memfd: bool = False


class _Program:
    """A tiny BPF assembler: instructions with symbolic jump targets, resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | None, str | None, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load(self, offset: int) -> None:
        self.code.append((LD_W_ABS, None, None, offset))

    def jump(self, op: int, k: int, true: str | None = None, false: str | None = None) -> None:
        self.code.append((op, true, false, k & 0xFFFFFFFF))

    def ret(self, value: int) -> None:
        self.code.append((RET_K, None, None, value))

    def allow_only(self, name: str, argument: int, values: tuple[int, ...]) -> None:
        """Block ``name``: allowed when the argument is one of ``values``, refused (EPERM) otherwise."""
        self.label(name)
        self.load(arg(argument))
        *others, last = values
        for value in others:
            self.jump(JEQ_K, value, "allow", None)
        self.jump(JEQ_K, last, "allow", "deny")

    def deny_any(self, name: str, argument: int, values: tuple[int, ...]) -> None:
        """Block ``name``: refused (EPERM) when the argument is one of ``values``, allowed otherwise."""
        self.label(name)
        self.load(arg(argument))
        for value in values:
            self.jump(JEQ_K, value, "deny", None)
        self.ret(SECCOMP_RET_ALLOW)

    def clone_flags(self) -> None:
        """The ``clone`` block: refused with any CLONE_NEW* flag, else allowed."""
        self.label("clone")
        self.load(arg(0))
        self.jump(JSET_K, CLONE_NS_FLAGS, "deny", "allow")

    def exits(self) -> None:
        """The shared exits ``allow``, ``deny`` (EPERM) and ``enosys``: last, as classic BPF only jumps forward."""
        self.label("allow")
        self.ret(SECCOMP_RET_ALLOW)
        self.label("deny")
        self.ret(SECCOMP_RET_ERRNO | errno.EPERM)
        self.label("enosys")
        self.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)

    def assemble(self) -> list[tuple[int, int, int, int]]:
        out = []
        for at, (op, true, false, k) in enumerate(self.code):
            offsets = []
            for target in (true, false):
                offset = 0 if target is None else self.labels[target] - at - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"BPF jump out of range at {at} to {target}")
                offsets.append(offset)
            out.append((op, offsets[0], offsets[1], k))
        return out


def build_filter(arch: str, policy: ExecutionPolicy) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) of one execution's filter."""
    audit_arch, numbers = ARCHES[arch]
    own = policy.pid & 0xFFFFFFFF
    group = -policy.pid & 0xFFFFFFFF
    rules: dict[str, str] = {name: "deny" for name in ALWAYS_DENIED}
    rules["clone3"] = "enosys"
    rules["clone"] = "clone"
    rules.update({name: "deny" for name in SYSV_IPC})
    rules["setsid"] = "deny"  # a session of its own is a scheduler autogroup of its own: CPU taken from the server
    if not policy.allow_memfd:
        rules.update({name: "deny" for name in MEMFD})
    rules.update({name: f"tmpfile_{name}" for name in OPEN_FLAGS})
    rules["openat2"] = "enosys"
    if not policy.signals_scoped:
        rules.update({name: "signal_process" for name in SIGNAL_TO_PROCESS})
        rules.update({name: "signal_thread" for name in SIGNAL_TO_THREAD})
    elif policy.protected:
        rules.update({name: "guard_process" for name in SIGNAL_TO_PROCESS})
        rules.update({name: "guard_thread" for name in SIGNAL_TO_THREAD})
    rules.update({name: "self_only" for name in PID_TARGETED})
    rules.update(setpriority="setpriority", ioprio_set="ioprio_set", fcntl="fcntl", ioctl="ioctl")
    rules.update({name: "deny" for name in SOCKETS})
    if policy.deny_chmod:
        rules.update({name: "deny" for name in CHMOD_FAMILY})

    p = _Program()
    p.load(ARCH)
    p.jump(JEQ_K, audit_arch, None, "deny")
    p.load(NR)
    if arch == "x86_64":
        p.jump(JGE_K, X32_SYSCALL_BIT, "deny", None)
    for name, block in sorted(rules.items(), key=lambda item: item[1]):
        if name in numbers:
            p.jump(JEQ_K, numbers[name], block, None)
    p.ret(SECCOMP_RET_ALLOW)

    p.clone_flags()

    p.label("signal_process")
    p.load(arg(0))
    for value in (0, own, group):
        p.jump(JEQ_K, value, "allow", None)
    p.ret(SECCOMP_RET_ERRNO | errno.EPERM)

    p.allow_only("signal_thread", 0, (own,))
    protected = tuple(pid & 0xFFFFFFFF for pid in policy.protected)
    if protected:
        p.deny_any("guard_process", 0, (0xFFFFFFFF, *protected, *(-pid & 0xFFFFFFFF for pid in policy.protected)))
        p.deny_any("guard_thread", 0, protected)
    for name, index in OPEN_FLAGS.items():
        p.label(f"tmpfile_{name}")
        p.load(arg(index))
        p.jump(JSET_K, O_TMPFILE_BIT, "deny", "allow")
    p.allow_only("self_only", 0, (0, own))

    p.label("setpriority")
    p.load(arg(0))
    p.jump(JEQ_K, PRIO_PROCESS, "who", "deny")
    p.label("ioprio_set")
    p.load(arg(0))
    p.jump(JEQ_K, IOPRIO_WHO_PROCESS, "who", "deny")
    p.allow_only("who", 1, (0, own))

    p.deny_any("fcntl", 1, (F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETPIPE_SZ))
    p.deny_any("ioctl", 1, (FIOSETOWN, SIOCSPGRP, TIOCSTI))

    p.exits()
    return p.assemble()


def build_namespace_denial(arch: str) -> list[tuple[int, int, int, int]]:
    """What a pod's RuntimeDefault profile does to a process without CAP_SYS_ADMIN: no namespaces.

    unshare and setns refused, clone refused with any CLONE_NEW* flag, clone3 ENOSYS. Used to start
    a server the way a restricted pod runs it (tests, benchmarks).
    """
    audit_arch, numbers = ARCHES[arch]
    p = _Program()
    p.load(ARCH)
    p.jump(JEQ_K, audit_arch, None, "allow")
    p.load(NR)
    p.jump(JEQ_K, numbers["unshare"], "deny", None)
    p.jump(JEQ_K, numbers["setns"], "deny", None)
    p.jump(JEQ_K, numbers["clone3"], "enosys", None)
    p.jump(JEQ_K, numbers["clone"], "clone", "allow")
    p.clone_flags()
    p.exits()
    return p.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def supported() -> bool:
    return platform.machine() in ARCHES


_INSTRUCTION = struct.Struct("HBBI")


def encode(program: list[tuple[int, int, int, int]]) -> bytes:
    """The program as the kernel reads it (an array of struct sock_filter)."""
    return b"".join(_INSTRUCTION.pack(*instruction) for instruction in program)


def install(program: list[tuple[int, int, int, int]]) -> None:
    """Load a filter into this process (sets no_new_privs first); OSError when the kernel refuses."""
    install_encoded(encode(program))


def install_encoded(raw: bytes) -> None:
    """``install`` for a program already encoded (``encode``, ``PreparedFilter.render``)."""
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(raw) // _INSTRUCTION.size, ctypes.cast(buffer, ctypes.c_void_p))
    no_new_privs()
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp filter")


def confine(policy: ExecutionPolicy) -> None:
    """Install the execution filter in this process."""
    install(build_filter(platform.machine(), policy))


_PROBE_PIDS = (1_000_003, 2_000_029)
"""Two pids no constant of a filter equals: building with each tells which instructions hold the pid."""


@dataclass(frozen=True)
class PreparedFilter:
    """An execution filter built and encoded once, without its pid.

    Only the execution's own pid differs between the filters of one worker's executions, and only
    in the constants of a few instructions (``own``: the pid, ``group``: its process group, the
    negated pid). Building the program is ~100 instructions of Python assembly and thousands of
    short-lived objects: in a freshly forked process that is half a millisecond of CPU and
    hundreds of copy-on-write page faults per execution. Prepared once in the zygote, an
    execution only patches those constants into a copy of the bytes (``render``), and the result
    is byte for byte what ``build_filter`` gives for its pid (``tests/sandbox/test_layers.py``).
    """

    raw: bytes
    own_at: tuple[int, ...]
    group_at: tuple[int, ...]

    def render(self, pid: int) -> bytes:
        program = bytearray(self.raw)
        for positions, value in ((self.own_at, pid & 0xFFFFFFFF), (self.group_at, -pid & 0xFFFFFFFF)):
            for at in positions:
                struct.pack_into("I", program, at * _INSTRUCTION.size + 4, value)  # k: after code, jt, jf
        return bytes(program)


def prepare(arch: str, policy: ExecutionPolicy) -> PreparedFilter:
    """The filter of ``policy`` for any pid (``policy.pid`` is ignored); see ``PreparedFilter``."""
    first, second = (build_filter(arch, replace(policy, pid=pid)) for pid in _PROBE_PIDS)
    if len(first) != len(second):
        raise ValueError("the filter's shape depends on the pid")
    own, group = [], []
    for at, (a, b) in enumerate(zip(first, second, strict=True)):
        if a == b:
            continue
        if a[:3] != b[:3]:
            raise ValueError(f"instruction {at} of the filter depends on the pid beyond its constant")
        if (a[3], b[3]) == tuple(pid & 0xFFFFFFFF for pid in _PROBE_PIDS):
            own.append(at)
        elif (a[3], b[3]) == tuple(-pid & 0xFFFFFFFF for pid in _PROBE_PIDS):
            group.append(at)
        else:
            raise ValueError(f"instruction {at} of the filter holds a constant derived from the pid in another way")
    prepared = PreparedFilter(encode(first), tuple(own), tuple(group))
    if prepared.render(_PROBE_PIDS[1]) != encode(second):
        raise ValueError("the prepared filter does not render the filter it was built from")
    return prepared


def probe() -> str | None:
    """Whether a process here can install the execution filter and it works; None when it does, else why not."""
    if not supported():
        return f"no seccomp filter for architecture {platform.machine()}"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            confine(ExecutionPolicy(pid=os.getpid()))
            code = 2
            os.kill(os.getpid(), 0)  # its own pid: allowed
            code = 3
            try:
                os.kill(-1, 0)
            except PermissionError:
                code = 4
                import socket

                try:
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                except PermissionError:
                    code = 0
        except BaseException:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else f"the seccomp filter could not be installed or did not hold (probe step {code})"
