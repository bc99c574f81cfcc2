"""A memory and a pids cgroup per execution, where the replica may write its own cgroup subtree.

The memory watch samples an execution's processes from outside: memory it cannot attribute to a
process (memfds, SysV segments, a process that exec'd between two samples) escapes it until the
next sample, and RLIMIT_NPROC counts a uid's processes, not one execution's. The kernel's memory
controller charges every page an execution's processes fault in (anonymous, shared, memfd, page
tables) to the execution's cgroup and reclaims or kills inside it at the limit; the pids controller
refuses its fork beyond ``pids.max``. So a fork bomb or a memory hog costs only its own execution,
and the kernel's OOM killer never picks the zygote or the server.

Where: the replica's own cgroup (``/proc/self/cgroup``) when it can write it, which needs root in
the initial user namespace here, or a runtime that delegates the subtree to the pod (a cgroup
namespace with a writable cgroupfs: docs/sandbox.md).

- cgroup v2 (unified): processes may not sit in a cgroup whose controllers are delegated to
  children (the no-internal-process rule), so the replica's processes move to a leaf
  ``<own>/server`` first; then ``+memory +pids`` go into ``<own>/cgroup.subtree_control`` and each
  execution gets ``<own>/exec-<worker>-<n>`` (``memory.max``, ``memory.swap.max`` 0,
  ``memory.oom.group`` 1, ``pids.max``).
- cgroup v1: one directory per controller; each execution gets
  ``<memory>/<own>/retool-sandbox-<server pid>/exec-...`` with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap is accounted) and the same under ``pids``.

An execution's limit is its ``memory_limit_MB`` plus the resident size of the warm interpreter it
was forked from (the pages it copies on write are charged to it; the watch subtracts the same
baseline). Pure functions decide (``locate``, ``limits``, ``oom_kills``); ``Subtree`` and
``Execution`` do the file I/O, every write naming the file when it fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids")
KILL_TIMEOUT_S = 2.0


class CgroupError(RuntimeError):
    """A cgroup could not be made, configured, joined or removed; the message names the file."""


def own_paths(proc_self_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path; the v2 (unified) line is under ``""``."""
    paths: dict[str, str] = {}
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


@dataclass(frozen=True)
class Layout:
    """Where this process's cgroups are: ``version`` 2 with one directory, or 1 with memory and pids."""

    version: int
    dirs: tuple[Path, ...]


def locate(proc_self_cgroup: str, root: Path = ROOT) -> Layout | None:
    """The directories of this process's memory and pids cgroups, or None when there are none to use."""
    paths = own_paths(proc_self_cgroup)
    if (root / "cgroup.controllers").is_file() and "" in paths:
        own = root / paths[""].lstrip("/")
        available = set(_read(own / "cgroup.controllers").split()) if (own / "cgroup.controllers").is_file() else set()
        return Layout(2, (own,)) if {"memory", "pids"} <= available else None
    if all(name in paths for name in V1_CONTROLLERS):
        dirs = tuple(root / name / paths[name].lstrip("/") for name in V1_CONTROLLERS)
        return Layout(1, dirs) if all(d.is_dir() for d in dirs) else None
    return None


def limits(version: int, memory_bytes: int, pids_max: int) -> dict[str, str]:
    """File -> value of one execution's cgroup (optional files are written when they exist)."""
    if version == 2:
        return {"memory.max": str(memory_bytes), "memory.swap.max": "0", "memory.oom.group": "1", "pids.max": str(pids_max)}
    return {"memory.limit_in_bytes": str(memory_bytes), "memory.memsw.limit_in_bytes": str(memory_bytes), "pids.max": str(pids_max)}


OPTIONAL = frozenset({"memory.swap.max", "memory.oom.group", "memory.memsw.limit_in_bytes"})
"""Files a kernel may lack (no swap accounting, older kernels): skipped when absent."""


def oom_kills(text: str) -> int:
    """The ``oom_kill`` count of ``memory.events`` (v2) or ``memory.oom_control`` (v1)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise CgroupError(f"{path}: {err.strerror or err}") from None


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as err:
        raise CgroupError(f"{path}: writing {value!r}: {err.strerror or err}") from None


def _pids(directory: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in (directory / "cgroup.procs").read_text().split()]
    return []


def _empty_and_remove(directory: Path) -> None:
    """Kill every process left in ``directory``, then remove it (retried while the kernel lets them go)."""
    if not directory.is_dir():
        return
    kill_file = directory / "cgroup.kill"
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while True:
        left = _pids(directory)
        if left:
            if kill_file.is_file():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        try:
            directory.rmdir()
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise CgroupError(f"{directory}: could not be removed ({err.strerror or err}; processes left: {left})") from None
        time.sleep(0.01)


@dataclass
class Execution:
    """One execution's cgroups (one directory per hierarchy)."""

    version: int
    dirs: tuple[Path, ...]

    def attach(self, pid: int) -> None:
        for directory in self.dirs:
            _write(directory / "cgroup.procs", str(pid))

    def set_memory(self, memory_bytes: int) -> None:
        """Change the memory limit (the job's, known only when it arrives)."""
        if self.version == 2:
            _write(self.dirs[0] / "memory.max", str(memory_bytes))
            return
        # v1 keeps memsw >= limit at every step: raise memsw first when growing, the limit first when shrinking
        limit, memsw = self.dirs[0] / "memory.limit_in_bytes", self.dirs[0] / "memory.memsw.limit_in_bytes"
        current = int(_read(limit).strip() or 0)
        order = (memsw, limit) if memory_bytes > current else (limit, memsw)
        for target in order:
            if target.exists():
                _write(target, str(memory_bytes))

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(CgroupError):
            return oom_kills(_read(self.dirs[0] / name))
        return 0

    def remove(self) -> None:
        for directory in self.dirs:
            _empty_and_remove(directory)


@dataclass
class Subtree:
    """The directories under which a replica makes its executions' cgroups."""

    version: int
    dirs: tuple[Path, ...]

    @classmethod
    def prepare(cls, layout: Layout, server_pid: int) -> Subtree:
        """Make the subtree (v2: the server leaf and the delegated controllers); CgroupError when it cannot."""
        if layout.version == 2:
            own = layout.dirs[0]
            leaf = own / "server"
            try:
                leaf.mkdir(exist_ok=True)
            except OSError as err:
                raise CgroupError(f"{leaf}: {err.strerror or err}") from None
            for _ in range(10):  # processes forked meanwhile are moved on the next round
                moving = _pids(own)
                if not moving:
                    break
                for pid in moving:
                    with contextlib.suppress(CgroupError):
                        _write(leaf / "cgroup.procs", str(pid))
            _write(own / "cgroup.subtree_control", "+memory +pids")
            return cls(2, (own,))
        made = []
        # Unique per replica: the server is pid 1 in every pod, and replicas may share a v1 hierarchy
        # (one replica's shutdown must not empty another's subtree).
        name = f"retool-sandbox-{server_pid}-{secrets.token_hex(6)}"
        for directory in layout.dirs:
            mine = directory / name
            try:
                mine.mkdir(exist_ok=True)
            except OSError as err:
                for done in made:
                    with contextlib.suppress(OSError):
                        done.rmdir()
                raise CgroupError(f"{mine}: {err.strerror or err}") from None
            made.append(mine)
        return cls(1, tuple(made))

    def execution(self, name: str, memory_bytes: int, pids_max: int) -> Execution:
        """A new execution's cgroups with their limits; removed again when a limit cannot be set."""
        dirs = tuple(directory / name for directory in self.dirs)
        made: list[Path] = []
        try:
            for directory in dirs:
                try:
                    directory.mkdir()
                except OSError as err:
                    raise CgroupError(f"{directory}: {err.strerror or err}") from None
                made.append(directory)
            for file, value in limits(self.version, memory_bytes, pids_max).items():
                # v1: memory.* in the memory hierarchy, pids.* in the pids one; v2: one directory
                target = (dirs[0] if self.version == 2 or file.startswith("memory.") else dirs[1]) / file
                if target.exists():
                    _write(target, value)
                elif file not in OPTIONAL:
                    raise CgroupError(f"{target}: missing (is the controller enabled there?)")
        except CgroupError:
            for directory in made:
                with contextlib.suppress(CgroupError):
                    _empty_and_remove(directory)
            raise
        return Execution(self.version, dirs)

    def probe(self) -> None:
        """Make and remove one execution's cgroups: CgroupError when this process cannot."""
        self.execution(f"probe-{os.getpid()}", 64 << 20, 16).remove()

    def remove(self) -> None:
        """Every execution cgroup left (a dead worker's), then the replica's own directories (v1);
        v2 leaves the delegated cgroup and the server leaf as they are."""
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                for child in directory.iterdir():
                    if child.is_dir() and child.name != "server":
                        with contextlib.suppress(CgroupError):
                            _empty_and_remove(child)
            if self.version == 1:
                with contextlib.suppress(CgroupError):
                    _empty_and_remove(directory)
