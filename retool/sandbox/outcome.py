"""Pure decisions of an execution: its resource limits, how its end maps to SandboxFusion statuses,
how capped output reads, and which file paths a request may name. No I/O, table-tested."""

from __future__ import annotations

import math
import posixpath
import resource
import signal
from dataclasses import dataclass

from retool.sandbox.accounting import PIPE_CHARGE_KIB
from retool.sandbox.api import CommandStatus, RunStatus

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-execution limits, sent by the worker to the child that applies them."""

    run_timeout_s: float
    memory_limit_mb: int
    max_processes: int
    max_file_size_mb: int
    max_open_files: int


def rlimits(limits: Limits, baseline_vm_bytes: int, processes_in_use: int = 0) -> dict[int, tuple[int, int]]:
    """Hard rlimits (soft == hard, so code cannot raise them again; SandboxFusion sets only soft ones).

    The address-space limit is the memory the code may allocate ON TOP of what the warm interpreter
    already maps (numpy, scipy, sympy: a few hundred MB of virtual memory), so ``import numpy`` works
    at any memory_limit_MB and a 100 MB limit still means 100 MB for the program. The CPU limit backs
    up the wall-clock timeout (SIGXCPU one second after it, SIGKILL one second later). RLIMIT_NPROC
    counts every process of the uid, so ``processes_in_use`` (other processes of a shared uid) is added:
    there it bounds only the replica's total (other executions' processes that exit after the count
    leave their room to this one, issue 49); the worker's watch ends an execution with more than
    ``max_processes`` tasks of its own (``accounting.tree``).
    The stack is left alone: capping it with the memory limit is what breaks numpy under SandboxFusion.
    """
    address_space = baseline_vm_bytes + limits.memory_limit_mb * MIB
    cpu = math.ceil(limits.run_timeout_s) + 1
    nproc = limits.max_processes + processes_in_use
    file_size = limits.max_file_size_mb * MIB
    return {
        resource.RLIMIT_AS: (address_space, address_space),
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_NPROC: (nproc, nproc),
        resource.RLIMIT_FSIZE: (file_size, file_size),
        resource.RLIMIT_NOFILE: (limits.max_open_files, limits.max_open_files),
        resource.RLIMIT_CORE: (0, 0),
    }


@dataclass(frozen=True)
class Verdict:
    run_status: CommandStatus
    status: RunStatus
    return_code: int | None


def verdict(*, exit_code: int | None, term_signal: int | None, timed_out: bool) -> Verdict:
    """SandboxFusion's statuses, exactly: ``Finished`` whenever the process ended by itself (any exit
    code, or a signal: negative return code), ``TimeLimitExceeded`` (no return code) when we killed it
    at run_timeout; the request is ``Success`` only for Finished with return code 0. (``Error`` is kept
    for sandbox-side failures.) verl's tool shows stdout+stderr only for Finished runs, so a traceback
    must come back as Finished for the model to see it.
    """
    if timed_out:
        return Verdict("TimeLimitExceeded", "Failed", None)
    return_code = -term_signal if term_signal else exit_code
    return Verdict("Finished", "Success" if return_code == 0 else "Failed", return_code)


def signal_note(term_signal: int | None, timed_out: bool) -> str:
    """A line for stderr saying why the program died, as a shell would (the model reads it)."""
    if timed_out or not term_signal:
        return ""
    try:
        name = signal.Signals(term_signal).name
    except ValueError:
        name = f"signal {term_signal}"
    if term_signal == signal.SIGXCPU:
        return f"Killed by {name}: CPU time limit exceeded"
    return f"Killed by {name}"


def limit_note(limit: str, amount_bytes: int, limits: Limits, scratch_mb: int, pipes_bytes: int = 0) -> str:
    """The stderr line of an execution ended by the worker's watch (all its processes together);
    for ``processes`` the amount is the tasks (processes and threads) it had, not bytes; for ``memory``
    ``pipes_bytes`` is the part the open pipes were counted for (named when it is 1 MB or more)."""
    if limit == "processes":
        return f"Killed: the program had {amount_bytes} processes and threads, over the sandbox's limit of {limits.max_processes} (MAX_PROCESSES)"
    if limit == "memory":
        in_pipes = f" ({pipes_bytes // MIB} MB of it for {pipes_bytes // (PIPE_CHARGE_KIB * 1024)} open pipes)" if pipes_bytes >= MIB else ""
        return f"Killed: the program's processes together used {amount_bytes // MIB} MB{in_pipes}, over memory_limit_MB={limits.memory_limit_mb}"
    return f"Killed: the program wrote {amount_bytes // MIB} MB or too many files in its directory, over the scratch quota of {scratch_mb} MB"


def render_output(kept: bytes, total_bytes: int, limit_bytes: int) -> str:
    """Decode captured output; when more was written than kept, end with a visible marker."""
    text = kept.decode("utf-8", errors="replace")
    if total_bytes > len(kept):
        text += f"\n[output truncated: {total_bytes} bytes written, only the first {limit_bytes} kept]\n"
    return text


MAX_PATH_COMPONENTS = 64
"""Directories a request's file path may nest: deep enough for any project layout, far below what
recursive directory code (``os.makedirs``) and the kernel's PATH_MAX meet (a path 1000 directories
deep made a worker hit Python's recursion limit, issue 49)."""
MAX_PATH_BYTES = 1024


def checked_relative_path(path: str) -> str:
    """A request's file path, normalised, that stays inside the execution directory; ValueError otherwise."""
    if not path or "\x00" in path:
        raise ValueError(f"file path {path!r} is empty or contains NUL")
    if path.count("/") >= MAX_PATH_COMPONENTS:
        raise ValueError(f"file path {path[:40]!r}... nests {path.count('/') + 1} components, over {MAX_PATH_COMPONENTS}")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ValueError(f"file path {path[:40]!r}... of {len(path)} characters is over {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise ValueError(f"file path {path!r} must be relative to the execution directory")
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../") or normal == ".":
        raise ValueError(f"file path {path!r} leaves the execution directory")
    return normal
