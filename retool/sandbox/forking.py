"""How the zygote forks an execution: the C library's ``fork()``, without the interpreter's lock repair.

``os.fork()`` does CPython's after-fork work in the child (``PyOS_AfterFork_Child``,
Modules/posixmodule.c, 3.10-3.13): it re-creates the GIL, the import lock and the runtime's locks,
drops other threads' states, then calls the Python functions registered with
``os.register_at_fork(after_in_child=...)``. In our interpreter those are threading's ``_after_fork``
(forget every other thread, re-create the locks they may hold), logging's
``_after_at_fork_child_reinit_locks`` (re-create the handlers' locks) and ``random``'s reseed of its
global generator. Everything but the reseed repairs what another thread could have left mid-operation.
The zygote has one thread and forks between requests, holding no lock: there the repair changes
nothing, yet it is Python code run in a fresh fork, touching pages the child shares with the zygote:
a child that does nothing else takes ~260 copy-on-write faults after ``os.fork`` against ~60 after a
raw fork. In an execution, whose set-up then touches many of the same pages anyway, ~60 of its ~630
set-up faults go (bench/RESULTS.md, "the raw fork").

So where the zygote qualifies (``Forker.probe``: CPython 3.10-3.13, one thread, the interpreter's
list of after-in-child functions found) it calls ``fork()`` through ctypes with the GIL held, and the
child calls every function of that list itself but those two (``after_in_child``): the reseed, and
anything else a module registered. The zygote's own before and after-in-parent functions (logging
takes its module lock around the fork) are skipped too: with one thread, nothing else could hold
it. The C library's own ``pthread_atfork`` handlers (OpenBLAS's) run either way. Anywhere else:
``os.fork()``.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable

LOCK_REPAIR: tuple[Callable[[], object], ...] = (
    threading._after_fork,  # type: ignore[attr-defined]
    logging._after_at_fork_child_reinit_locks,  # type: ignore[attr-defined]
)
"""The after-in-child functions that only repair state another thread may have left inconsistent."""

VERSIONS = ((3, 10), (3, 13))
"""The CPython versions whose ``PyOS_AfterFork_Child`` was read for this (oldest, newest)."""

forked_raw = False
"""True in a process that a raw fork made (set first thing by ``after_in_child``): how a test, or
anyone, sees that an execution was not forked the slow way."""

_after_in_child: list[Callable[[], object]] | None = None
"""The interpreter's own list of after-in-child functions (``locate``): the one ``os.register_at_fork``
appends to, so a function registered later is in it too."""


def locate() -> list[Callable[[], object]] | None:
    """The interpreter's list of after-in-child functions, found once as the only list that holds
    threading's; None where it cannot be found. Call it before ``gc.freeze()``: frozen objects are out
    of the collector's view (the template does, and its workers and zygotes inherit the answer)."""
    global _after_in_child
    if _after_in_child is None:
        found = [ref for ref in gc.get_referrers(threading._after_fork) if type(ref) is list]  # type: ignore[attr-defined]
        if len(found) == 1:
            _after_in_child = found[0]
    return _after_in_child


class Forker:
    """``fork()`` for the zygote: the C library's where ``probe`` allows it, else ``os.fork``."""

    def __init__(self, raw: bool) -> None:
        self.raw = raw
        self._fork: Callable[[], int] = os.fork
        if raw:
            libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the call
            libc.fork.restype = ctypes.c_int
            libc.fork.argtypes = []
            self._fork = libc.fork

    @classmethod
    def probe(cls) -> Forker:
        """A raw forker where this process qualifies: CPython of ``VERSIONS``, one thread (every thread
        of the process, native ones included, as /proc lists them), the after-in-child list found."""
        qualifies = (
            sys.implementation.name == "cpython"
            and VERSIONS[0] <= sys.version_info[:2] <= VERSIONS[1]
            and locate() is not None
            and _threads() == 1
        )
        return cls(qualifies)

    def fork(self) -> int:
        """The child's pid in the parent, 0 in the child (which then calls ``after_in_child``)."""
        pid = self._fork()
        if pid < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"fork: {os.strerror(errno)}")
        return pid

    def after_in_child(self, skip: tuple[Callable[[], object], ...] = ()) -> None:
        """In the child of a raw fork: what ``os.fork`` would have called there but the lock repair
        and ``skip`` (what the caller does another way: ``reseed``).

        The list is copied first, as CPython does: a function may register another."""
        if not self.raw:
            return
        global forked_raw
        forked_raw = True
        for function in list(_after_in_child or ()):
            if function not in LOCK_REPAIR and function not in skip:
                function()


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0
