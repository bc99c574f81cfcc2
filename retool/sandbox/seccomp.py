"""A seccomp filter that stops an execution from signalling the sandbox's own processes.

Without a pid namespace (a pod with every capability dropped under the RuntimeDefault profile),
executions run as the server's uid, and the kernel lets a process signal any process of its uid:
``os.kill(-1, 9)`` would take down the server, the template and every worker. This filter makes the
signal syscalls (and pidfd_open, the other way to reach a process by pid) fail with EPERM when
they target -1 or one of a given set of pids / process groups, and allows everything else, so
code can still signal its own children. Installed after no_new_privs, which lets an unprivileged
process load it; filters cannot be removed, and the children of the execution inherit it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from retool.sandbox.isolation import _check, _libc

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

# BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
LD_ABS, JEQ, RET = 0x20, 0x15, 0x06

# (audit arch, {syscall: number}) of the architectures sandbox images are built for.
ARCHES = {
    "x86_64": (0xC000003E, {"kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434}),
    "aarch64": (0xC00000B7, {"kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_open": 434}),
}


def build_filter(arch: str, protected: set[int]) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k): EPERM for signal syscalls whose first argument is protected.

    ``protected`` holds pids; their negations (process groups) and -1 are protected too. Only the low
    32 bits of the argument are compared, which is what the kernel uses for a pid_t.
    """
    audit_arch, numbers = ARCHES[arch]
    values = sorted({v & 0xFFFFFFFF for pid in protected if pid > 0 for v in (pid, -pid)} | {0xFFFFFFFF})
    syscalls = sorted(numbers.values())
    # Layout: [arch check][nr checks][load arg0][value checks][allow][deny]
    program: list[tuple[int, int, int, int]] = []
    n_sys, n_val = len(syscalls), len(values)
    allow_at = 1 + 1 + 1 + n_sys + 1 + n_val  # index of the allow instruction
    deny_at = allow_at + 1
    program.append((LD_ABS, 0, 0, 4))  # arch
    program.append((JEQ, 0, allow_at - 2, audit_arch))
    program.append((LD_ABS, 0, 0, 0))  # syscall number
    for i, number in enumerate(syscalls):
        here = 3 + i
        check_at = 3 + n_sys
        program.append((JEQ, check_at - here - 1, (allow_at - here - 1) if i == n_sys - 1 else 0, number))
    program.append((LD_ABS, 0, 0, 16))  # low 32 bits of args[0]
    for i, value in enumerate(values):
        here = 3 + n_sys + 1 + i
        program.append((JEQ, deny_at - here - 1, (allow_at - here - 1) if i == n_val - 1 else 0, value))
    program.append((RET, 0, 0, SECCOMP_RET_ALLOW))
    program.append((RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    return program


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def supported() -> bool:
    return platform.machine() in ARCHES


def protect(pids: set[int]) -> None:
    """Install the filter in this process (requires no_new_privs); OSError when the kernel refuses."""
    program = build_filter(platform.machine(), pids)
    raw = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp filter")


def sandbox_pids(worker_pid: int) -> set[int]:
    """The worker and all its ancestors up to pid 1 (the server in a container), with their process groups."""
    pids: set[int] = set()
    current = worker_pid
    while current >= 1:
        pids.add(current)
        if current == 1:
            break
        try:
            pids.add(os.getpgid(current))
            with open(f"/proc/{current}/stat") as f:
                current = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return {pid for pid in pids if pid > 0}


def probe(pids: set[int]) -> str | None:
    """Whether a child of this process can install the filter; None when it can, else why not."""
    if not supported():
        return f"no seccomp signal guard for architecture {platform.machine()}"
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            from retool.sandbox.isolation import no_new_privs

            no_new_privs()
            protect(pids)
            os.kill(-1, 0)
            code = 2  # the filter did not stop kill(-1)
        except PermissionError:
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else f"the seccomp signal guard could not be installed (probe exit {code})"
