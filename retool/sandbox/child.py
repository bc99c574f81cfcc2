"""What runs inside an execution process, forked from a worker before its job arrives.

The worker forks the next child while it is idle (the fork of an interpreter holding numpy, sympy
and scipy costs milliseconds; this takes it off the request's path). The child detaches into its own
session, closes every inherited descriptor, drops privileges and enters every isolation layer of the
plan (its own Landlock domain, its seccomp filter), acknowledges that on a pipe it then closes, and
blocks until the worker sends the job. Then it applies the limits and runs the code in a fresh
``__main__``. It reports nothing itself: its exit status, read by the worker with ``wait4``, is the
only verdict (anything written on a descriptor could be the code's own forgery).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import linecache
import logging
import os
import platform
import resource
import signal
import struct
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from retool.sandbox import forking, isolation, landlock, protocol, reseed, seccomp
from retool.sandbox.outcome import Limits, rlimits

try:
    from retool.sandbox import _settle as _native  # built from _settle.c where a C compiler was found
except ImportError:
    _native = None

CODE_FILENAME = "main.py"
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _close_other_fds(keep: set[int], close_range: CloseRange | None) -> None:
    """Close every descriptor above 2 but ``keep``: with ``close_range(2)`` where the zygote found it works
    (one syscall per gap between kept descriptors), else by walking /proc/self/fd."""
    if close_range is not None:
        low = 3
        for fd in sorted(k for k in keep if k >= low):
            if fd > low:
                close_range(low, fd - 1)
            low = fd + 1
        close_range(low, CloseRange.MAX_FD)
        return
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class CloseRange:
    """``close_range(first, last, 0)`` (Linux 5.9) called directly, probed once in the zygote.

    Not ``os.closerange``: where the syscall is missing (an older kernel, a runtime such as gVisor
    that lacks it) or a seccomp profile refuses it, CPython falls back to closing every number up to
    ``last`` one by one, a million calls at a typical ``RLIMIT_NOFILE``. The probe decides once: the
    syscall when it answers, else the /proc walk. Its number is 436 on every architecture (it came
    after the tables were unified, include/uapi/asm-generic/unistd.h)."""

    NUMBER = 436
    MAX_FD = 0xFFFFFFFF  # ~0U: the highest descriptor number

    def __init__(self) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._long = ctypes.c_long
        self._number = ctypes.c_long(self.NUMBER)
        self._flags = ctypes.c_long(0)

    def __call__(self, first: int, last: int) -> None:
        if self._libc.syscall(self._number, self._long(first), self._long(last), self._flags) != 0:
            raise OSError(f"close_range({first}, {last}) failed")

    @classmethod
    def probe(cls) -> CloseRange | None:
        """This, when the kernel closes an empty range for this process; None otherwise."""
        try:
            close_range = cls()
            close_range(cls.MAX_FD - 1, cls.MAX_FD)  # nothing is open there: closes nothing, succeeds where the syscall exists
        except (OSError, AttributeError):
            return None
        return close_range


def _baseline_vm_bytes() -> int:
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 256).split()[0]) * resource.getpagesize()
    finally:
        os.close(fd)


def _exit_code_of(exc: SystemExit) -> int:
    """What ``python main.py`` would exit with after ``sys.exit(value)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


class Stdio(NamedTuple):
    stdin: io.TextIOWrapper
    stdout: io.TextIOWrapper
    stderr: io.TextIOWrapper


def build_stdio() -> Stdio:
    """In the zygote, once: the text streams a fresh ``python main.py`` has on descriptors 0, 1 and 2,
    for every execution to take as they are. Built in each execution they cost ~120 copy-on-write
    faults (the objects, their buffers, the codec lookups); built here, an execution only writes into
    its copy. They are built while 0, 1 and 2 are of the kinds the execution will have there (a
    memfd for stdin, pipes for stdout and stderr), because each stream reads its descriptor's
    seekability and position when it is made and keeps them; the zygote's own 0, 1 and 2 are put
    back after (one that was closed is closed again: a server started with a closed stdout still
    runs code)."""
    closed = []
    for fd in (0, 1, 2):  # taken first, so that neither the memfd nor the pipe lands on one of them
        try:
            os.fstat(fd)
        except OSError:
            placeholder = os.open(os.devnull, os.O_RDWR)
            if placeholder != fd:
                os.dup2(placeholder, fd)
                os.close(placeholder)
            closed.append(fd)
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    stdin_file = os.memfd_create("stdin")
    read_end, write_end = os.pipe()
    try:
        os.dup2(stdin_file, 0)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        return Stdio(
            io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8", errors="backslashreplace", line_buffering=True),
        )
    finally:
        for fd, old in zip((0, 1, 2), saved, strict=True):
            os.dup2(old, fd)
            os.close(old)
        for fd in (stdin_file, read_end, write_end, *closed):
            os.close(fd)


@dataclass(frozen=True)
class Prepared:
    """The layers every execution of a zygote applies identically, built once in the zygote.

    A fork copies them into each execution, which then only applies them: its Landlock rules
    (the read-only paths opened, their rights decided, encoded; the execution adds its own
    directory) and its seccomp filter (assembled and encoded; the execution patches in its pid).
    Built in each execution they cost ~1.5 ms of CPU per request, most of it copy-on-write faults
    of the pages the building touches (bench/RESULTS.md, "where the time goes"). What is applied
    is unchanged: ``landlock.PreparedRules`` and ``seccomp.PreparedFilter`` say why.
    """

    rules: landlock.PreparedRules | None
    filter: seccomp.PreparedFilter | None
    close_range: CloseRange | None
    """How an execution closes what it inherits (``_close_other_fds``)."""
    forker: forking.Forker
    """How the zygote forks an execution, and what the execution then does first (``forking``)."""
    native: bytes | None
    """The plan of ``_settle.settle`` (``pack_native_plan``), when the zygote's executions make their
    setup with the compiled helper; None: from Python (``_settle_layers``)."""
    reseed: reseed.Plan
    """How each execution reseeds the random generators it inherits (``reseed``)."""
    stdio: Stdio
    """The execution's ``sys.stdin``, ``sys.stdout`` and ``sys.stderr``, built once (``build_stdio``)."""


settled_natively = False
"""In an execution: its setup was ``_settle.settle``'s (the tests read it, as ``forking.forked_raw``)."""

NATIVE_PLAN_VERSION = 3
_NATIVE_HEADER = struct.Struct("=8I2i2Q")


def native_setup_error() -> str | None:
    """None where the compiled setup (``_settle.c``, built at install) can be used; else why not.

    A checkout whose ``_settle.c`` is newer than its build is refused: the helper applies the
    isolation layers, and a stale one would apply what the source no longer says (``make install``
    rebuilds it)."""
    if _native is None:
        return "the compiled helper (retool/sandbox/_settle.c) was not built: no C compiler at install"
    if getattr(_native, "PLAN_VERSION", None) != NATIVE_PLAN_VERSION:
        return f"the compiled helper speaks plan version {getattr(_native, 'PLAN_VERSION', None)}, not {NATIVE_PLAN_VERSION}: rebuild it (make install)"
    source = os.path.join(os.path.dirname(__file__), "_settle.c")
    with contextlib.suppress(OSError):
        if os.stat(source).st_mtime > os.stat(_native.__file__).st_mtime:
            return "the compiled helper is older than retool/sandbox/_settle.c: rebuild it (make install)"
    return None


def pack_native_plan(rules: landlock.PreparedRules | None, prepared_filter: seccomp.PreparedFilter | None) -> bytes:
    """What ``_settle.settle`` applies, encoded once per zygote: the Landlock ruleset attribute, the
    prepared rules (each holds its open descriptor) and the rights of the execution's own directory;
    the seccomp program and where its pid goes; ``OOM_SCORE_ADJ`` and ``NICE``. The layout is
    ``_settle.c``'s ``parse_plan``."""
    abi = rules.abi if rules is not None else 0
    landlocked = rules is not None and abi >= 1
    attr = landlock._ruleset_attr(abi) if landlocked else b""
    encoded_rules = b"".join(rule.raw for _fd, rule in rules.rules) if landlocked else b""
    program = prepared_filter.raw if prepared_filter is not None else b""
    own = prepared_filter.own_at if prepared_filter is not None else ()
    group = prepared_filter.group_at if prepared_filter is not None else ()
    flags = (1 if landlocked else 0) | (2 if prepared_filter is not None else 0)
    header = _NATIVE_HEADER.pack(
        NATIVE_PLAN_VERSION, abi, len(attr), len(encoded_rules) // 12, len(program) // 8, len(own), len(group), flags,
        OOM_SCORE_ADJ, NICE, landlock.fs_rights(abi), landlock.FILE_RIGHTS,
    )
    return header + attr + encoded_rules + program + struct.pack(f"={len(own)}I", *own) + struct.pack(f"={len(group)}I", *group)


def prepare(layers: dict[str, Any]) -> Prepared:
    """In the zygote, once, before its first fork: the prepared layers of its executions (``layers``:
    their setup but the directory). Also leaves the zygote's environment at ``SAFE_ENV``
    (``scrub_environment``) and its logging as a fresh interpreter's (``fresh_logging``): its
    executions inherit both."""
    scrub_environment()  # before the first fork: every execution inherits SAFE_ENV
    fresh_logging()  # and a fresh interpreter's logging, not the template's JSON handlers
    rules = landlock.prepare(layers["read_paths"], layers["landlock_abi"]) if layers["landlock_abi"] else None
    policy = seccomp.ExecutionPolicy(
        pid=0,  # an execution's own, patched in by it (``PreparedFilter.render``)
        signals_scoped=layers["signals_scoped"],
        deny_chmod=layers["deny_chmod"],
        # Same-uid executions in a pid namespace could otherwise signal the zygote (this process, their parent).
        protected=(os.getpid(),) if layers.get("protect_parent") else (),
    )
    prepared_filter = seccomp.prepare(platform.machine(), policy) if layers["seccomp"] else None
    native = pack_native_plan(rules, prepared_filter) if layers.get("native_setup") and native_setup_error() is None else None
    return Prepared(rules, prepared_filter, CloseRange.probe(), forking.Forker.probe(), native, reseed.locate(native is not None), build_stdio())


def execution_signals() -> None:
    """The signal dispositions of a fresh ``python main.py`` (SIGINT raises KeyboardInterrupt, the
    others do what the kernel does by default), set in the zygote when it starts: every execution
    inherits them with the fork. Set in each execution they cost ~0.3 ms of CPU per request (the
    ``signal`` module's enum conversions touching pages shared with the zygote). The zygote itself
    loses nothing: it had these already but SIGINT, which now ends it through KeyboardInterrupt
    (its loop's ``except BaseException``) instead of the default action; either way it dies."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def fresh_logging() -> None:
    """The root logger as ``python main.py`` starts with it: no handler, level WARNING. The template
    configured its own (one JSON line per record, INFO), which every fork inherits: an execution's
    ``logging.warning("x")`` printed a JSON object instead of ``x``, and ``logging.basicConfig`` in its
    code did nothing, the root logger having a handler already. Called in the zygote, which logs
    nothing itself (its worker keeps the replica's logging)."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)


def scrub_environment() -> None:
    """Leave this process's environment at exactly ``SAFE_ENV`` (the zygote's: every execution
    inherits it and only adds its own directory's variables)."""
    os.environ.clear()
    os.environ.update(SAFE_ENV)


def main(go_fd: int, stdout_fd: int, stderr_fd: int, ack_fd: int, setup: dict[str, Any], prepared: Prepared) -> NoReturn:
    """Entry of a freshly forked child; never returns.

    Everything that does not depend on the request (detaching, dropping privileges, the isolation
    layers, a clean environment, fresh stdio, fresh random seeds) happens before the job arrives, off
    its latency. A failure there exits without acknowledging: the worker then refuses to run code.
    """
    global settled_natively
    exit_code = 70
    acknowledged = False
    try:
        # After a raw fork, what os.fork runs here but the lock repair (``forking``) and what the reseed replaces.
        prepared.forker.after_in_child(skip=prepared.reseed.covered)
        worker = os.getppid()
        if prepared.native is not None:  # the same calls as below, in one native call (``_settle.c``)
            baseline_vm, stdin_fd = _native.settle(  # type: ignore[union-attr]
                prepared.native, setup["cwd"], worker, go_fd, stdout_fd, stderr_fd, ack_fd, setup["drop"][0], setup["uid"], setup["gid"], setup["dumpable"]
            )
            settled_natively = True
        else:
            os.setsid()
            isolation.die_with_parent(worker)
            # Signal dispositions: the zygote's (``execution_signals``), which a fork keeps.
            # The prepared Landlock paths stay open until the execution has restricted itself (``_settle_layers``).
            _close_other_fds({go_fd, stdout_fd, stderr_fd, ack_fd, *(prepared.rules.fds if prepared.rules else ())}, prepared.close_range)
            baseline_vm = _baseline_vm_bytes()
            stdin_fd = os.memfd_create("stdin")  # before seccomp, which refuses memfds to the code
            _settle_layers(setup, prepared, stdout_fd, stderr_fd, worker)
        _settle_interpreter(setup["cwd"], prepared)
        os.write(ack_fd, b"k")
        acknowledged = True
        os.close(ack_fd)
        job = protocol.MARSHAL.loads(_read_all(go_fd))  # the worker's (``protocol.MARSHAL`` says why)
        os.close(go_fd)
        exit_code = _run(job, baseline_vm, stdin_fd, prepared.stdio.stdin)
    except BaseException:  # the harness itself failed: say so, the worker reports it
        report = traceback.format_exc().encode(errors="replace")
        if not acknowledged:  # on the acknowledgement pipe: it is open whichever step failed, stdio or not
            with contextlib.suppress(OSError):
                os.write(ack_fd, SETUP_FAILED + report[-SETUP_REPORT_BYTES:])
        with contextlib.suppress(OSError):
            os.write(2, report)  # fd 2: the execution's stderr once settled, the zygote's before
    os._exit(exit_code)


SETUP_FAILED = b"E"
"""First byte on the acknowledgement pipe of an execution whose setup failed; the report follows."""
SETUP_REPORT_BYTES = 3500
"""The report's tail: one write under PIPE_BUF (4096) arrives whole."""


def _settle_layers(setup: dict[str, Any], prepared: Prepared, stdout_fd: int, stderr_fd: int, worker: int) -> None:
    """Directory, scheduling, stdio, credentials, Landlock, seccomp: the process's side of the setup
    (``_settle.c`` makes these calls in this order where it was built)."""
    cwd = setup["cwd"]
    os.chdir(cwd)
    _yield_to_the_server()
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    if setup["drop"] == "uid":
        os.setgroups([])
        os.setgid(setup["gid"])
        os.setuid(setup["uid"])
    elif setup["drop"] == "caps":
        isolation.drop_capabilities()
    isolation.die_with_parent(worker)  # new credentials cleared it
    isolation.no_new_privs()
    if prepared.rules is not None:
        try:
            prepared.rules.restrict_self(write=(cwd,))
        finally:
            prepared.rules.close()
    if prepared.filter is not None:
        seccomp.install_encoded(prepared.filter.render(os.getpid()))
    if setup["dumpable"]:
        isolation.set_dumpable(True)


def _settle_interpreter(cwd: str, prepared: Prepared) -> None:
    """The interpreter's side: environment, fresh stdio, ``sys.argv`` and ``sys.path``, fresh seeds."""
    os.environ.update(HOME=cwd, TMPDIR=cwd, PWD=cwd)  # to the zygote's, which is SAFE_ENV (``prepare``)
    if "tempfile" in sys.modules:  # forget a temp dir the template may have cached
        sys.modules["tempfile"].tempdir = None
    sys.stdout, sys.stderr = prepared.stdio.stdout, prepared.stdio.stderr
    sys.argv = [CODE_FILENAME]
    sys.path[0] = cwd
    seeds = prepared.reseed
    if seeds.native:  # a fork copies the generators' states: seed them as a fresh interpreter does
        _native.reseed(seeds.native)  # type: ignore[union-attr]
    for seed in seeds.seeds:
        seed()


OOM_SCORE_ADJ = 1000
"""The kernel's OOM killer takes an execution first, never the template, a worker or the server."""
NICE = 10
"""Where the kernel schedules by autogroup (one per session: the execution gets one and may not start
another), this orders its processes within it; without autogroups it yields the CPU to the server."""


def _yield_to_the_server() -> None:
    """Before any privilege is dropped: the OOM killer's first choice, and a lower CPU priority.

    Raising either needs no privilege; lowering the OOM score back needs write access to /proc,
    which Landlock takes away, and a lower nice value needs CAP_SYS_NICE.
    """
    isolation.set_dumpable(True)  # a non-dumpable process's /proc files are root's: not writable as a plain uid
    with contextlib.suppress(OSError):
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(OOM_SCORE_ADJ).encode())
        finally:
            os.close(fd)
    isolation.set_dumpable(False)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)


def _apply(job: dict[str, Any], baseline_vm: int, stdin_fd: int, stdin: io.TextIOWrapper) -> None:
    os.write(stdin_fd, (job.get("stdin") or "").encode())
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    os.dup2(stdin_fd, 0)
    os.close(stdin_fd)
    sys.stdin = stdin
    limits = Limits(**job["limits"])
    for res, (soft, hard) in rlimits(limits, baseline_vm, job.get("processes_in_use", 0)).items():
        resource.setrlimit(res, (soft, hard))


def _run(job: dict[str, Any], baseline_vm: int, stdin_fd: int, stdin: io.TextIOWrapper) -> int:
    _apply(job, baseline_vm, stdin_fd, stdin)
    code = job["code"]
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __file__=CODE_FILENAME)
    sys.modules["__main__"] = module
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    try:
        exec(compile(code, CODE_FILENAME, "exec"), module.__dict__)
        exit_code = 0
    except SystemExit as exc:
        exit_code = _exit_code_of(exc)
    except BaseException as exc:
        # Drop the harness frame: the traceback reads like ``python main.py``'s.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        exit_code = 1
    try:
        import threading

        threading._shutdown()  # wait for non-daemon threads, as the interpreter does at exit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return exit_code
