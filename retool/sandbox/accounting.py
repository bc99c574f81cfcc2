"""What an execution uses across all its processes, read from /proc, and the scratch sweep.

rlimits are per process: ten processes under a 350 MB address-space limit can hold 3.5 GB between
them. Where no cgroup is delegated to the sandbox (the usual pod), the worker watches the sum
itself while the execution runs (``MemoryWatch``) and ends the execution when it goes over; the
scratch directory is watched the same way when it is not a size-limited tmpfs of its own.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from retool.sandbox import scratch

KIB = 1024


def children(pid: int | str) -> list[int]:
    """The direct children of ``pid`` (``"self"``: of this process, in the pid namespace /proc shows)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        text = _read(f"/proc/{pid}/task/{task}/children")
        if text is not None:
            kids.extend(int(x) for x in text.split())
    return kids


def descendants(pid: int | str) -> list[int]:
    """Every descendant of ``pid`` (via /proc/<pid>/task/*/children), parents before children.

    Pids are as /proc shows them: pass ``"self"`` rather than ``os.getpid()`` from inside a pid
    namespace whose /proc could not be remounted (the two numberings differ there).
    """
    return tree(pid)[0]


def tree(pid: int | str) -> tuple[list[int], int]:
    """``descendants(pid)``, and how many tasks (processes and threads, zombies included) they are
    together: what RLIMIT_NPROC and a pids cgroup count. The walk lists every descendant's
    ``task`` directory anyway, so the count costs nothing more."""
    found: list[int] = []
    tasks = 0
    frontier: list[int | str] = [pid]
    root = True
    while frontier:
        current = frontier.pop()
        counted, root = not root, False  # the root's own tasks are not its descendants'
        try:
            threads = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        if counted:
            tasks += len(threads)
        for task in threads:
            text = _read(f"/proc/{current}/task/{task}/children")
            if text is None:
                continue
            kids = [int(x) for x in text.split()]
            found.extend(kids)
            frontier.extend(kids)
    return found, tasks


def parse_status_memory(text: str) -> int:
    """Resident anonymous + shared-memory KiB of a /proc/<pid>/status text.

    Two searches, not a split of its ~55 lines: the zygote reads its own status before every fork,
    and every object made there is a copy-on-write page (its pre-forked execution shares them)."""
    total = 0
    for key in ("\nRssAnon:", "\nRssShmem:"):
        at = text.find(key)
        if at >= 0:
            total += int(text[at + len(key) : text.index("kB", at)])
    return total


def parse_rollup_memory(text: str) -> int:
    """Proportional anonymous + shared-memory KiB of a /proc/<pid>/smaps_rollup text.

    Pages shared with the warm template (and the other workers forked from it) count only for their
    share, pages shared between the execution's own processes add up to what they really hold.
    """
    total = 0
    for line in text.splitlines():
        if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
            total += int(line.split()[1])
    return total


def _read(path: str) -> str | None:
    """The whole text of a /proc file; None when it cannot be read. Plain descriptor reads, not
    ``open()``'s three I/O layers: the zygote reads its own status before every fork and its children
    after every execution, the memory watch several files per process per tick."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def resident_kib(pid: int | str) -> int:
    text = _read(f"/proc/{pid}/status")
    return parse_status_memory(text) if text else 0


def proportional_kib(pid: int) -> int | None:
    """None when it cannot be read (a process that has exited, or one we may not inspect)."""
    text = _read(f"/proc/{pid}/smaps_rollup")
    return parse_rollup_memory(text) if text else None


def estimate(resident: Iterable[int], baseline_kib: int, forked: Iterable[bool] | None = None) -> int:
    """Cheap upper bound of what the processes hold beyond one warm interpreter: their resident
    memory summed, less the warm interpreter's baseline once when any of them still runs the forked
    image (``forked``; by default all do).

    The baseline is subtracted once, not from each process: a fork's inherited pages are free only
    while it still shares them with the zygote, and nothing in /proc/<pid>/status says it does. A
    fork that unmapped what it inherited and mapped fresh memory, or wrote over it (copy on write),
    keeps the same resident size, its pages now its own: subtracted per process, 30 such children
    counted 0 while holding ~1.9 GB (issue 49). Once, the sum bounds what the execution holds beyond
    one interpreter's worth of pages, which an execution's memory cgroup grants it too
    (``worker._cgroup_bytes``); a process that replaced its image (``exec``) shares nothing anyway.
    """
    amounts = list(resident)
    flags = list(forked) if forked is not None else [True] * len(amounts)
    if len(flags) != len(amounts):
        raise ValueError("one forked flag per process")
    return max(0, sum(amounts) - (baseline_kib if any(flags) else 0))


def start_stack(pid: int | str) -> int:
    """Where the process's stack began (``/proc/<pid>/stat`` field 28): the same in every process
    forked from the warm interpreter, new (address space layout randomisation) after an ``exec``.
    0 when it cannot be read (the kernel shows it only to who may ptrace-read the process)."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return 0
    fields = text.rsplit(")", 1)[-1].split()
    return int(fields[25]) if len(fields) > 25 else 0


def unlinked_open_bytes(pids: Iterable[int]) -> int:
    """Bytes held by files the processes keep open after removing them (or opened unnamed): a
    directory walk cannot see them, yet they fill the scratch volume. Each file counts once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if info.st_nlink == 0 and stat.S_ISREG(info.st_mode) and key not in seen:
                seen.add(key)
                total += info.st_blocks * 512
    return total


PIPE_CHARGE_KIB = 64
"""What one open pipe counts against the memory limit: its default capacity, PIPE_DEF_BUFFERS (16)
pages of 4 KiB (include/linux/pipe_fs_i.h), the most a pipe holds here since the filter refuses
``F_SETPIPE_SZ``. Kernel memory no resident size shows (issue 49: processes x open files / 2 x 64 KiB,
150-175 MB per execution). A bound, not a reading: an empty pipe holds no page yet, and past its uid's
``pipe-user-pages-soft`` the kernel gives a new pipe 2 pages (fs/pipe.c, ``alloc_pipe_info``)."""


def open_pipes(pids: Iterable[int]) -> int:
    """Distinct pipes the processes hold open (one held by several of them, or at both ends, counts once).
    A readdir of /proc/<pid>/fd and a readlink per descriptor: ~2 us each."""
    seen: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not readable
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("pipe:["):
                seen.add(target)
    return len(seen)


class UidProcesses:
    """How many processes of ``uid`` /proc lists (RLIMIT_NPROC counts them, see ``outcome.rlimits``).

    Asked once per execution. Listing /proc is one call; the owner of each pid is a ``stat`` apiece,
    ~0.1 ms per execution for the ~50 processes of a replica. A pid keeps its owner while it lives,
    and a process of a replica's uid cannot take another without privileges, so each pid is looked
    up once, when it first appears, and forgotten when it leaves the listing. A pid that died and
    was reused by a process of another owner between two listings (the kernel hands pids out in
    increasing order, so only after a wrap-around of the whole pid space) is counted as its
    predecessor was: off by one for one execution.
    """

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self._owned: dict[str, bool] = {}
        self._counted = -1
        self._at = 0.0

    def count(self, max_age_s: float = 0.0) -> int:
        """The count; one made less than ``max_age_s`` ago is answered again without listing /proc."""
        now = time.monotonic()
        if self._counted >= 0 and now - self._at < max_age_s:
            return self._counted
        seen: dict[str, bool] = {}
        known = self._owned
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            owned = known.get(name)
            if owned is None:
                try:
                    owned = os.stat(f"/proc/{name}").st_uid == self.uid
                except OSError:  # gone since the listing
                    continue
            seen[name] = owned
        self._owned = seen
        self._counted, self._at = sum(seen.values()), now
        return self._counted


@dataclass
class MemoryWatch:
    """Ends an execution whose processes together hold more than its memory limit.

    Every tick costs one /proc/<pid>/status and one /proc/<pid>/stat read per process (~15 and ~9
    microseconds for a fork of the warm interpreter). Only when that cheap bound (``estimate``: the
    resident sizes summed, less one warm baseline) is over the limit is the exact figure read
    (smaps_rollup: ~0.8 ms per such process, a page-table walk), so code that forks after allocating
    (pages shared, counted once) is not wrongly killed; the exact pass then comes again at most every
    ``exact_every_s``, or ten times as long as the last one took (a tenth of the worker's CPU at most,
    as the disk watch). smaps_rollup needs ptrace-read access: the execution makes itself dumpable
    where siblings cannot use that (Landlock, namespaces or a uid of its own), and ``inspect``
    switches the worker to the execution's uid for the read when it has one. The processes that
    still cannot be read count with the cheap bound of their resident memory re-read at that moment
    (an exited one counts nothing).

    Both figures add the pipes the processes hold open, each at ``PIPE_CHARGE_KIB``: counted on a
    cadence of their own (a descriptor walk, every ``exact_every_s`` or ten times its last cost), and
    between two counts the last one stands.
    """

    limit_kib: int
    baseline_kib: int
    inspect: Callable[[Callable[[], int]], int] = field(default=lambda read: read())
    warm_stack: int = 0
    """``start_stack`` of the warm interpreter: a process with another one has exec'd (0: unknown,
    every process then counts whole in the cheap estimate)."""
    slack_kib: int = 16 * 1024
    exact_every_s: float = 0.1
    exact_cost_factor: float = 10.0
    """The next exact pass waits at least this many times what the last one took."""
    _next_exact: float = 0.0
    _next_pipes: float = 0.0
    pipes_kib: int = 0
    """The pipes' share of the last figure (their count times ``PIPE_CHARGE_KIB``)."""
    peak_kib: int = 0

    def over(self, pids: list[int], now: float | None = None) -> int | None:
        """The execution's memory in KiB when it is over the limit, else None."""
        now = time.monotonic() if now is None else now
        resident: dict[int, int] = {}
        forked: dict[int, bool] = {}

        def cheap_pass() -> int:
            if now >= self._next_pipes:
                started = time.monotonic()
                self.pipes_kib = open_pipes(pids) * PIPE_CHARGE_KIB
                self._next_pipes = now + max(self.exact_every_s, self.exact_cost_factor * (time.monotonic() - started))
            for pid in pids:
                resident[pid] = resident_kib(pid)
                forked[pid] = self.warm_stack != 0 and start_stack(pid) == self.warm_stack
            return estimate(resident.values(), self.baseline_kib, forked.values())

        cheap = self.inspect(cheap_pass) + self.pipes_kib
        if cheap <= self.limit_kib + self.slack_kib or now < self._next_exact:
            return None

        def read() -> int:
            # A process that cannot be read now counts with its resident memory *now*: one that
            # exited since the cheap pass (short-lived children do) holds nothing any more, and
            # counting its earlier figure would end an execution that is within its limit.
            total, unread, unread_forked = 0, 0, False
            for pid in resident:
                exact = proportional_kib(pid)
                if exact is None:
                    unread += resident_kib(pid)
                    unread_forked = unread_forked or forked[pid]
                else:
                    total += exact
            return total + estimate([unread], self.baseline_kib, [unread_forked])

        started = time.monotonic()
        exact = self.inspect(read) + self.pipes_kib
        self.peak_kib = max(self.peak_kib, exact)
        self._next_exact = now + max(self.exact_every_s, self.exact_cost_factor * (time.monotonic() - started))
        return exact if exact > self.limit_kib + self.slack_kib else None


def _scandir(path: str) -> Any:
    """A directory the code took read or search permission from is given it back (the worker owns
    it, or may override): a directory the watch cannot list would hide what it holds."""
    try:
        return os.scandir(path)
    except PermissionError:
        os.chmod(path, 0o700)
        return os.scandir(path)


def directory_usage(path: str, max_entries: int) -> tuple[int, int]:
    """(bytes allocated, entries) beneath ``path``; stops counting past ``max_entries``."""
    total, entries = 0, 0
    stack = [path]
    while stack and entries <= max_entries:
        current = stack.pop()
        try:
            with _scandir(current) as it:
                for entry in it:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, entries


SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def sweep(directories: Iterable[str], uids: set[int], created_before: float, keep: Iterable[str], created_after: float = 0.0) -> list[str]:
    """Remove what executions left in the shared scratch directories; returns the paths removed.

    An entry goes when an execution uid owns it and it changed between ``created_after`` (the
    replica's start: older files are not ours) and ``created_before`` (the start of the oldest
    execution still running, so nothing a running execution made is touched). ``keep`` (the
    replica's own directory) is never touched; symlinks are removed, never followed.
    """
    kept = {os.path.realpath(k) for k in keep}
    removed = []
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid not in uids or not created_after <= info.st_ctime < created_before or os.path.realpath(entry.path) in kept:
                continue
            if not scratch.remove_path(entry.path):
                removed.append(entry.path)
    return removed
