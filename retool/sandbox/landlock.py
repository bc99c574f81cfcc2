"""Landlock: unprivileged confinement of an execution's filesystem, TCP and signals (Linux >= 5.13).

Landlock needs no privilege (only no_new_privs), which is why it is the layer that still holds in a
pod with every capability dropped and the RuntimeDefault seccomp profile. What each ABI adds:

- 1 (5.13): filesystem access rights, enforced beneath directories. Also, independently of the
  rules, a Landlocked process cannot ptrace (nor read the memory, environment, fds or cwd of) any
  process outside its own domain.
- 2 (5.19): REFER (renames and links across directories).
- 3 (6.2): TRUNCATE.
- 4 (6.7): TCP bind and connect.
- 5 (6.10): device ioctls.
- 6 (6.12): scoping: no signal to, and no connection to an abstract unix socket of, any process
  outside the domain.

Every execution gets its own domain (``landlock_restrict_self`` in its pre-forked process), so two
executions are outside each other's domains: what one may do stops at its own directory and its
own processes. Each function raises OSError with the errno, so callers can report what is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from retool.sandbox.isolation import _libc, no_new_privs

# Syscall numbers are the same on x86_64 and aarch64 (the generic table).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1

# Filesystem access rights, by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The only rights a rule on a non-directory may carry."""


def fs_rights(abi: int) -> int:
    """Every filesystem right this ABI knows (all are handled, so all are denied unless allowed)."""
    if abi < 1:
        return 0
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def net_rights(abi: int) -> int:
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def kernel_abi() -> int:
    """The Landlock ABI of the running kernel; 0 when Landlock is absent or disabled."""
    _libc.syscall.restype = ctypes.c_long
    abi = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(abi))


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@dataclass(frozen=True)
class Policy:
    """What one execution may touch. Paths are resolved when the rules are added.

    ``read``: read and execute beneath (the Python installation, system libraries, /proc);
    ``write``: everything beneath (the execution's own directory); ``devices``: character devices
    that may be read and written (/dev/null, /dev/urandom, ...).
    """

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...] = DEVICES


@dataclass(frozen=True)
class Applied:
    abi: int
    filesystem: bool
    network: bool
    scoped: bool


def _syscall(number: int, *args: object) -> int:
    _libc.syscall.restype = ctypes.c_long
    result = _libc.syscall(number, *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock syscall {number}: {os.strerror(err)}")
    return int(result)


def _ruleset_attr(abi: int) -> bytes:
    """struct landlock_ruleset_attr, only as long as this ABI knows (older kernels reject unknown fields)."""
    fields = [fs_rights(abi)]
    if abi >= 4:
        fields.append(net_rights(abi))
    if abi >= 6:
        fields.append(scopes(abi))
    return struct.pack(f"{len(fields)}Q", *fields)


def _encode_rule(access: int, fd: int) -> ctypes.Array:
    """struct landlock_path_beneath_attr (packed) allowing ``access`` beneath the open ``fd``."""
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        access &= FILE_RIGHTS
    return ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)


_PATH_BENEATH, _NO_FLAGS = ctypes.c_int(RULE_PATH_BENEATH), ctypes.c_uint32(0)


def _add_rule(ruleset: int, attr: ctypes.Array) -> None:
    _syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), _PATH_BENEATH, attr, _NO_FLAGS)


def _add_path(ruleset: int, path: str, access: int) -> bool:
    """Allow ``access`` beneath ``path``; False when the path does not exist."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        _add_rule(ruleset, _encode_rule(access, fd))
    finally:
        os.close(fd)
    return True


@dataclass
class PreparedRules:
    """The read and device rules of a policy, opened and encoded once, for many processes to apply.

    Every execution of a worker gets the same read-only paths and devices; only its own directory
    (the write rule) differs. Opening each path, deciding its rights and encoding the rule costs
    each freshly forked execution ~1 ms of CPU, most of it copy-on-write faults of the interpreter's
    pages. Prepared once in the zygote (``prepare``), the paths stay open there (``O_PATH``: no
    access to their contents) and every execution inherits them: it makes its own ruleset from the
    encoded rules, adds its directory, restricts itself, and closes the inherited descriptors
    (``restrict_self``, then ``close``). The rules are the ones ``restrict_self(policy)`` adds for
    the same paths; the only difference is when the paths are resolved (once per worker, not once
    per execution): a read-only path replaced while the replica runs keeps the rule on what it was.
    """

    abi: int
    rules: tuple[tuple[int, ctypes.Array], ...]
    """(open descriptor of the path, its encoded rule), read paths first, then devices."""

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _rule in self.rules)

    def restrict_self(self, write: tuple[str, ...]) -> Applied:
        """Confine this process to these rules plus everything beneath each of ``write`` (see the
        module function ``restrict_self``, whose rules these are); sets no_new_privs."""
        if self.abi < 1:
            return Applied(0, False, False, False)
        attr = _ruleset_attr(self.abi)
        buffer = ctypes.create_string_buffer(attr, len(attr))
        ruleset = _syscall(SYS_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
        try:
            for _fd, rule in self.rules:
                _add_rule(ruleset, rule)
            for path in write:
                if not _add_path(ruleset, path, fs_rights(self.abi)):
                    raise OSError(2, f"landlock: the execution directory {path} does not exist")
            no_new_privs()
            _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        finally:
            os.close(ruleset)
        return Applied(self.abi, True, self.abi >= 4, self.abi >= 6)

    def close(self) -> None:
        """Close the paths' descriptors in this process (an execution, once it has restricted itself)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def prepare(read: Iterable[str], abi: int, devices: Iterable[str] = DEVICES) -> PreparedRules:
    """Open and encode the read rules (read and execute beneath each of ``read``) and the device rules
    (read and write) of a policy; paths that do not exist are left out, as ``restrict_self`` does."""
    if abi < 1:
        return PreparedRules(abi, ())
    rules = []
    for paths, access in ((read, READ_FILE | READ_DIR | EXECUTE), (devices, READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0))):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            rules.append((fd, _encode_rule(access, fd)))
    return PreparedRules(abi, tuple(rules))


def restrict_self(policy: Policy, abi: int) -> Applied:
    """Confine this process (and everything it starts) to ``policy`` with the rights of ``abi``.

    Network: with ABI >= 4 every TCP bind and connect is denied (no rule allows any port). Scopes:
    with ABI >= 6 signals and abstract unix sockets stop at the domain. Sets no_new_privs.
    """
    prepared = prepare(policy.read, abi, policy.devices)
    try:
        return prepared.restrict_self(policy.write)
    finally:
        prepared.close()


def read_paths(candidates: Iterable[str], keep_out: Iterable[str]) -> tuple[str, ...]:
    """The read-only paths of a policy: existing ``candidates`` that do not contain ``keep_out``.

    A read rule on a parent of the scratch directory (``/``, ``/tmp``, a server started with its cwd
    there) would open every sibling execution's directory: such candidates are dropped.
    """
    outside = [os.path.realpath(p) for p in keep_out]
    chosen: list[str] = []
    for candidate in candidates:
        if not candidate:
            continue
        real = os.path.realpath(candidate)
        if real == "/" or not os.path.exists(real) or real in chosen:
            continue
        if any(o == real or o.startswith(real.rstrip("/") + "/") or real.startswith(o.rstrip("/") + "/") for o in outside):
            continue
        chosen.append(real)
    return tuple(chosen)
