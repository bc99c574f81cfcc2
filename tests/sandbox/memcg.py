"""A memory cgroup to start a sandbox server in, standing in for the pod's memory limit.

The tests run as root and may create a child of their own memory cgroup (cgroup v1's ``memory``
hierarchy, or v2 where the memory controller is enabled). The test process joins it only while it
starts the server, so the server and everything it forks are charged there, and leaves at once.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(directory of this process's memory cgroup, name of its limit file), None when there is none."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (directory / "memory.limit_in_bytes").exists():
                return directory, "memory.limit_in_bytes"
        if hierarchy == "0":
            directory = Path("/sys/fs/cgroup") / path.lstrip("/")
            with contextlib.suppress(OSError):
                if "memory" in (directory / "cgroup.subtree_control").read_text().split():
                    return directory, "memory.max"
    return None


def why_not() -> str | None:
    """Why a memory cgroup cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    own = _own_memory_cgroup()
    if own is None or not os.access(own[0], os.W_OK):
        return "no writable memory cgroup"
    return None


@contextlib.contextmanager
def limited(limit_bytes: int) -> Iterator[contextlib.AbstractContextManager]:
    """A fresh memory cgroup limited to ``limit_bytes``; yields a context manager that keeps this
    process in it (what it starts inside stays there). Removed at the end (it must be empty)."""
    own = _own_memory_cgroup()
    if own is None:
        raise RuntimeError("no memory cgroup")
    parent, limit_file = own
    group = parent / f"retool-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    (group / limit_file).write_text(str(limit_bytes))

    @contextlib.contextmanager
    def inside() -> Iterator[None]:
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (parent / "cgroup.procs").write_text(str(os.getpid()))

    try:
        yield inside()
    finally:
        for _ in range(50):  # the server's processes may take a moment to leave after it stopped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
