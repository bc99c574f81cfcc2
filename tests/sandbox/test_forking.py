"""The zygote's raw fork (``retool.sandbox.forking``) and the uid's process count (``accounting.UidProcesses``).

The fork is checked in fresh interpreters (subprocesses): what it skips and what it keeps depends
on the interpreter's state (its threads, the functions registered at fork, the garbage collector's
view), which the test process's own must not lend it. What an execution sees through the real
server after it is in ``test_executions_after_a_raw_fork_behave_as_after_os_fork``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from retool.sandbox import accounting
from tests.sandbox.conftest import can_start_pods, start_server, stop_server

PROBE = textwrap.dedent(
    """
    import gc, json, os, random, sys, threading
    from retool.sandbox import forking

    found = forking.locate()
    ran = os.pipe()
    def registered():
        os.write(ran[1], b"r")
    os.register_at_fork(after_in_child=registered)  # after locate: the list is the interpreter's own
    forker = forking.Forker.probe()
    lock, state = threading._active_limbo_lock, random.getstate()
    report, parent = os.pipe(), os.getpid()
    pid = forker.fork()
    if pid == 0:
        forker.after_in_child()
        out = []
        worker = threading.Thread(target=lambda: out.append(threading.current_thread() is not threading.main_thread()))
        worker.start()
        worker.join()
        grandchild = os.fork()  # the interpreter's own fork, with its own after-fork work, still works
        if grandchild == 0:
            os._exit(7 if threading.current_thread() is threading.main_thread() else 1)
        _, status = os.waitpid(grandchild, 0)
        facts = {
            "marked": forking.forked_raw,
            "registered_ran": os.read(ran[0], 1) == b"r",
            "lock_repaired": threading._active_limbo_lock is not lock,
            "reseeded": random.getstate() != state,
            "thread_ran": out == [True],
            "grandchild_exit": os.waitstatus_to_exitcode(status),
            "pid_is_new": os.getpid() != parent,
        }
        os.write(report[1], json.dumps(facts).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"raw": forker.raw, "found": found is not None and found[-1] is registered, **json.loads(os.read(report[0], 4096))}))
    """
)


def probe(script: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_raw_fork_runs_what_was_registered_at_fork_but_the_lock_repair() -> None:
    facts = probe(PROBE)
    assert facts == {
        "raw": True,  # a fresh CPython with one thread qualifies
        "marked": True,
        "found": True,  # the located list is the interpreter's: a function registered later is in it
        "registered_ran": True,
        "lock_repaired": False,  # threading's repair skipped: the lock the parent had, unchanged
        "reseeded": True,  # random's reseed kept
        "thread_ran": True,
        "grandchild_exit": 7,
        "pid_is_new": True,
    }


@pytest.mark.parametrize(
    ("before", "why"),
    [
        ("import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n", "a second thread"),
        ("import gc, threading\ngc.freeze()\n", "the list frozen before it was located"),
    ],
)
def test_os_fork_where_the_raw_fork_does_not_qualify(before: str, why: str) -> None:
    facts = probe(before + PROBE)
    assert facts["raw"] is False and facts["marked"] is False, why
    # os.fork did its whole after-fork work: the lock repaired, the registered function run
    assert facts["lock_repaired"] and facts["registered_ran"] and facts["reseeded"], facts


def test_the_uids_processes_are_counted_as_a_full_scan_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    def full_scan() -> int:
        count = 0
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    count += os.stat(f"/proc/{name}").st_uid == os.getuid()
                except OSError:
                    continue
        return count

    counter = accounting.UidProcesses(os.getuid())
    assert counter.count() == full_scan()
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k))
    before = counter.count()
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert counter.count(max_age_s=3600) == before and not stats  # a count young enough is answered again
        with_it = counter.count()
        assert f"/proc/{sleeper.pid}" in stats  # a new pid is looked up
        stats.clear()
        assert counter.count() == with_it
        assert f"/proc/{sleeper.pid}" not in stats  # and only once while it lives
    finally:
        sleeper.communicate(b"")
    monkeypatch.undo()
    assert counter.count() == full_scan()  # the exited one is forgotten


FRESH_INTERPRETER = textwrap.dedent(
    """
    import concurrent.futures, json, logging, os, random, threading
    out = []
    t = threading.Thread(target=lambda: out.append(threading.current_thread().name))
    t.start(); t.join()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # registers at-fork functions of its own
        squares = list(pool.map(abs, [-1, -2, -3]))
    spinner = threading.Event()
    busy = threading.Thread(target=spinner.wait, daemon=True); busy.start()
    pid = os.fork()  # with a second thread alive: the interpreter's own after-fork work must run
    if pid == 0:
        os._exit(3 if threading.active_count() == 1 and threading.current_thread() is threading.main_thread() else 1)
    forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    spinner.set(); busy.join()
    fresh = logging.getLogger().handlers == [] and logging.getLogger().level == logging.WARNING
    logging.basicConfig(level=logging.INFO, format="%(levelname)s|%(message)s")
    logging.info("logged")
    from retool.sandbox import child, forking  # preloaded with the sandbox: what made this process
    main = threading.current_thread() is threading.main_thread()
    native = child.settled_natively
    facts = {"thread": out, "forked": forked, "squares": squares, "random": random.random(), "main": main, "raw": forking.forked_raw}
    print(json.dumps({**facts, "fresh_logging": fresh, "native": native}))
    """
)


def test_executions_after_a_raw_fork_behave_as_after_os_fork() -> None:
    """Threads, a fork with a thread alive, a thread pool and logging (as a fresh interpreter has it)
    work in an execution of the restricted pod shape, which the raw fork made and the compiled helper
    set up, and no two executions share ``random``'s state."""
    if (why := can_start_pods()) is not None:
        pytest.skip(why)
    server = start_server(2, kind="pod", uid=10031)
    try:
        assert httpx.get(f"{server.url}/readyz", timeout=10).json()["isolation"]["execution_setup"] == "native"
        seen = []
        for _ in range(6):
            reply = httpx.post(f"{server.url}/run_code", json={"code": FRESH_INTERPRETER, "language": "python", "run_timeout": 20}, timeout=60).json()
            assert reply["status"] == "Success", reply["run_result"]["stderr"]
            facts = json.loads(reply["run_result"]["stdout"].splitlines()[-1])
            assert len(facts["thread"]) == 1 and facts["thread"] != ["MainThread"], facts
            assert facts["forked"] == 3 and facts["squares"] == [1, 2, 3] and facts["main"], facts
            assert facts["raw"], "the server's zygote forked this execution with os.fork, not the raw fork"
            assert facts["native"], "the execution made its setup from Python, not with the compiled helper"
            # logging as in a fresh interpreter: no handler of the sandbox's own, so basicConfig takes effect
            assert facts["fresh_logging"] and reply["run_result"]["stderr"] == "INFO|logged\n", reply
            seen.append(facts["random"])
        assert len(set(seen)) == len(seen), "random's state was shared between executions"
    finally:
        stop_server(server)

