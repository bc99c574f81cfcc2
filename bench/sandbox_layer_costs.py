"""What each layer issue 23 added costs, measured alone (no HTTP, no server).

- ``zygote round trip``: the one call on a request's path that the zygote adds (the worker asks it to
  ``wait4`` the execution and kill what it left; measured here with no process to wait for: the
  ``kill`` operation, same message sizes and the same two context switches);
- ``memory watch, per process per tick``: the stack-start read that tells an exec'd process from a
  fork (``/proc/<pid>/stat``), next to the resident-memory read the watch already made;
- ``disk watch, per process per tick``: counting files held open after removal (``/proc/<pid>/fd``);
- ``seccomp filter``: building and installing the larger filter in a fresh process (off the
  request's path: the pre-forked process does it while idle).

    python bench/sandbox_layer_costs.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retool.sandbox import accounting, seccomp
from retool.sandbox.zygote import Zygote


def timed(action: Callable[[], object], rounds: int) -> tuple[float, float]:
    """(p50, p90) in microseconds."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * len(samples))]


def seccomp_install() -> None:
    pid = os.fork()
    if pid == 0:
        seccomp.confine(seccomp.ExecutionPolicy(pid=os.getpid(), signals_scoped=True, protected=(os.getppid(),)))
        os._exit(0)
    os.waitpid(pid, 0)


def bare_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    zygote = Zygote(pid_namespace=False)
    me = os.getpid()
    rows = {
        "zygote round trip (kill, nothing to kill)": timed(zygote.kill, args.rounds),
        "memory watch: resident read (existing)": timed(lambda: accounting.resident_kib(me), args.rounds),
        "memory watch: stack-start read (new)": timed(lambda: accounting.start_stack(me), args.rounds),
        "disk watch: unlinked open files (new)": timed(lambda: accounting.unlinked_open_bytes([me]), args.rounds),
        "fork + exit + wait of this process (reference)": timed(bare_fork, max(50, args.rounds // 20)),
        "fork + seccomp install + exit + wait": timed(seccomp_install, max(50, args.rounds // 20)),
    }
    zygote.close()
    load = os.getloadavg()[0]
    print(f"load average (1 min) {load:.1f}, {args.rounds} rounds")
    print(f"{'what':<50} {'p50 µs':>10} {'p90 µs':>10}")
    for name, (p50, p90) in rows.items():
        print(f"{name:<50} {p50:>10.1f} {p90:>10.1f}")


if __name__ == "__main__":
    main()
