"""What each layer issue 23 added costs, measured alone (no HTTP, no server).

- ``zygote round trip``: the one call on a request's path that the zygote adds (the worker asks it to
  ``wait4`` the execution and kill what it left; measured here with no process to wait for: the
  ``kill`` operation, same message sizes and the same two context switches);
- ``memory watch, per process per tick``: the stack-start read that tells an exec'd process from a
  fork (``/proc/<pid>/stat``), next to the resident-memory read the watch already made;
- ``disk watch, per process per tick``: counting files held open after removal (``/proc/<pid>/fd``);
- ``seccomp filter``: building and installing the larger filter in a fresh process (off the
  request's path: the pre-forked process does it while idle);
- ``cgroup per execution`` (where this process may write its cgroup subtree): making an execution's
  memory and pids cgroups, moving the process in, removing them after it (on the request's path),
  and the OOM counter the worker reads each watch tick.

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

import itertools

from retool.sandbox import accounting, cgroups, seccomp
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


def cgroup_rows(rounds: int) -> dict[str, tuple[float, float]]:
    """The cgroup layer's costs, or nothing where this process cannot make cgroups."""
    layout = cgroups.locate(Path("/proc/self/cgroup").read_text())
    if layout is None:
        return {}
    try:
        subtree = cgroups.Subtree.prepare(layout, os.getpid())
        subtree.probe()
    except cgroups.CgroupError as err:
        print(f"no cgroup rows: {err}")
        return {}
    names = (f"bench-{n}" for n in itertools.count())

    def fork_in_cgroup() -> None:
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(go_r, 1)
            os._exit(0)
        group = subtree.execution(next(names), 256 << 20, 64)
        group.attach(pid)
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        group.remove()
        os.close(go_r)
        os.close(go_w)

    probe = subtree.execution("bench-oom-counter", 256 << 20, 64)
    try:
        return {
            "fork + cgroup make/join/remove + exit + wait (new)": timed(fork_in_cgroup, max(50, rounds // 20)),
            f"cgroup OOM counter read per tick, v{subtree.version} (new)": timed(probe.oom_kills, rounds),
        }
    finally:
        probe.remove()
        subtree.remove()


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
        **cgroup_rows(args.rounds),
    }
    zygote.close()
    load = os.getloadavg()[0]
    print(f"load average (1 min) {load:.1f}, {args.rounds} rounds")
    print(f"{'what':<50} {'p50 µs':>10} {'p90 µs':>10}")
    for name, (p50, p90) in rows.items():
        print(f"{name:<50} {p50:>10.1f} {p90:>10.1f}")


if __name__ == "__main__":
    main()
