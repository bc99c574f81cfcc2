"""Symbolic equivalence worker: a child process that answers one comparison per input line.

Run as a script (``python symbolic_worker.py``) by :mod:`retool.recipe.reward.symbolic`; it imports only the
standard library and math-verify so that it starts the same way wherever the reward file lives.

Protocol: each stdin line is JSON ``{"id": int, "pred": str, "truth": str, "timeout_s": float,
"deadline": float}``; each answer is one stdout line ``{"id": int, "eq": bool}`` or ``{"id": int,
"eq": false, "error": str}`` with the request's id (``"error": "timeout"``: this process's own timer
ended it). Requests are served by an executor forked from this (warm) process, which prints
``{"ready": true, "pid": N}`` when it starts; the parent kills that pid at a deadline and waits for
the next ready line. A request read after its ``deadline`` (``time.monotonic()``, one clock for all
processes) was left in the pipe by a killed executor: it is answered ``"error": "expired"`` at
once, not computed.

Why a separate process: sympy can spend minutes inside one C-level big-integer operation that no
signal interrupts (one late squaring of a power like ``9^{9^9}``: CPython checks signals only between
its squarings), and verl calls the reward from a thread pool where signals cannot be used at all.
The parent kills this process at its deadline; the interval timer here ends the common slow cases
(a long pure-Python simplification, a power still early in its squarings) without a restart.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import signal
import sys
import threading
import time
from typing import BinaryIO

# A comparison needs tens of MB; a cap turns a memory bomb into a MemoryError instead of swapping.
MEMORY_LIMIT_BYTES = int(os.environ.get("RETOOL_SYMBOLIC_MEMORY_BYTES", str(2 << 30)))


# One comparison of each kind that reaches this worker (simplify, sets, intervals, logs, roots).
_WARM_UP = (
    ("x^2+2x+1", "(x+1)^2"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("[1,2)", "[1,2)"),
    ("\\log_2 8", "3"),
    ("(1,2)", "(1,2)"),
    ("\\frac{\\pi}{2}", "\\frac{1}{2}\\pi"),
)


class _SoftTimeoutError(BaseException):
    """Not an Exception: math-verify wraps its steps in ``except Exception`` and would swallow the
    timer's interruption, go on with its next strategy, and leave the executor to the parent's kill."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _SoftTimeoutError


def compare(pred: str, truth: str) -> bool:
    """math-verify's equivalence of two answers given as LaTeX or plain expressions (truth is gold)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = parse(f"${truth}$", extraction_config=configs, parsing_timeout=None)
    if not gold:
        gold = parse(truth, extraction_config=configs, parsing_timeout=None)
    answer = parse(f"${pred}$", extraction_config=configs, parsing_timeout=None)
    if not answer:
        answer = parse(pred, extraction_config=configs, parsing_timeout=None)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=None))


def _exit_with_parent(parent: int) -> None:
    """End this process when its parent dies, even in the middle of a C-level computation."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _limit_cpu(budget_s: float) -> None:
    """Let the kernel end this process if one comparison outlives its budget by seconds.

    The parent kills a late worker, and the watchdog thread ends an orphan, but neither helps when
    the parent is gone and the main thread holds the GIL inside one big-integer operation.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + budget_s) + 2
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _serve_requests(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The executor: answer requests until stdin closes. Runs in a child forked from the warm zygote."""
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGALRM, _on_alarm)
    stdout.write(json.dumps({"ready": True, "pid": os.getpid()}).encode() + b"\n")
    stdout.flush()
    while line := stdin.readline():
        reply: dict = {"id": None}
        try:
            request = json.loads(line)
            reply["id"] = request.get("id")
            if time.monotonic() >= float(request.get("deadline", math.inf)):
                # sent to an executor killed before it read it: its caller has given up on it
                reply.update(eq=False, error="expired")
                _write(stdout, reply)
                continue
            budget = max(float(request.get("timeout_s", 1.0)), 0.001)
            _limit_cpu(budget)
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                reply["eq"] = compare(str(request["pred"]), str(request["truth"]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeoutError:
            reply.update(eq=False, error="timeout")
        except Exception as exc:  # any failure of one comparison (MemoryError, RecursionError, ...) is "not equivalent"
            reply.update(eq=False, error=f"{type(exc).__name__}: {exc}"[:200])
        _write(stdout, reply)


def _write(stdout: BinaryIO, reply: dict) -> None:
    stdout.write(json.dumps(reply).encode() + b"\n")
    stdout.flush()


def serve(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """The zygote: import and warm up once, then fork an executor, and a new one whenever it is killed.

    A killed executor is replaced by a fork of this warm process in milliseconds, instead of a new
    interpreter that needs seconds to import sympy. The zygote never reads stdin and runs no
    threads, so forking it is safe; it exits when an executor ends normally (stdin closed).
    """
    parent = os.getppid()  # before the warm-up: the parent may die while sympy imports
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    logging.disable(logging.WARNING)  # math-verify warns about its disabled timeouts on every call
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    for pred, truth in _WARM_UP:  # sympy imports much lazily on first use: pay for it before forking
        compare(pred, truth)
    stdout.flush()
    quick_failures = 0
    while os.getppid() == parent:  # orphaned: nobody will send work
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _serve_requests(stdin, stdout)
                code = 0
            except BrokenPipeError:
                code = 0  # the parent closed our stdout: it is gone or done with us
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return
        # a kill at a deadline is normal; executors that keep dying at once are not
        quick_failures = quick_failures + 1 if time.monotonic() - started < 0.05 else 0
        if quick_failures >= 20:
            return


if __name__ == "__main__":
    serve()
