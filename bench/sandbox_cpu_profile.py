"""Where the CPU of one request goes: ``print(1+1)`` against the restricted-pod server, by process.

    sudo python bench/sandbox_cpu_profile.py [--duration 8] [--rounds 2] [--json out.json]
    sudo python bench/sandbox_cpu_profile.py --compare ../main   # before/after: that checkout's server too
    sudo python bench/sandbox_cpu_profile.py [--compare ../main] --together   # all at once, floor too, c=8 each

Throughput on a shared 2-vCPU machine moves with everyone else's load; the CPU time each process
spends per request does not (much). So this starts our server the way the restricted pod runs it
(tests/sandbox/podlike.py ``pod``: one uid for every execution, no capabilities, no namespaces, 16
workers, every layer on), drives ``print(1+1)`` at c=1 and c=16 with the closed-loop client of
``sandbox_bench`` (every answer checked), and reads, before and after each measurement, the
utime+stime of every process of the replica from /proc/<pid>/stat:

- ``server``: the uvicorn process (HTTP, body checks, pydantic, JSON, dispatch to a worker);
- ``workers``: the worker processes (the per-execution bookkeeping: scratch directory, pipes,
  the zygote round trips, the watches, the output drain, the result message, the cleanup);
- ``zygotes``: their zygotes (the fork of the warm interpreter is charged to the process that forks);
- ``executions``: what the zygotes reaped (cutime+cstime: the execution processes, from the fork's
  return to their exit's teardown), split with /proc/<pid>/schedstat of the pre-forked processes
  left idle at the end (they have done their setup and wait for a job) into ``setup`` (detach,
  privilege and Landlock/seccomp layers, fresh stdio, before any job) and ``run`` (the job itself:
  limits, the code, the interpreter's exit);
- ``template`` (should be ~0) and ``client`` (this process: the load generator, not the sandbox).

With ``--compare`` the two servers are measured one after the other in each round, the order
alternating from round to round (this VM's speed drifts within a round). ``--together`` measures
every server and the fork floor (in a process of its own) in the same seconds instead, c=8 each:
their CPU per request then shares the machine's state, and the line ``the floor's CPU per request /
ours`` is the throughput ratio both would reach if each used the whole machine (alone, the floor
leaves ~10 % of it idle: its one parent forks serially). Then the same for the fork
floor of ``sandbox_compare`` (a warm interpreter forking one child per
request, stdout on a pipe; getrusage of this process and of its reaped children). Each row is CPU
milliseconds per answered request; ``machine busy`` is what /proc/stat says all CPUs did meanwhile
(anything above the listed processes is other work on the machine). The load average is printed
at the start and the end of every measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sandbox_bench
import sandbox_compare

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[float, float] | None:
    """(own utime+stime, reaped children's cutime+cstime) of ``pid`` in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        pass
    return kids


def _schedstat_s(pid: int) -> float | None:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def replica_tree(server: int) -> dict[str, list[int]]:
    """The replica's long-lived processes by role (the restricted pod's tree: server -> template ->
    worker -> zygote -> the pre-forked execution waiting for its job)."""
    templates = [p for p in _children(server) if b"retool.sandbox.template" in Path(f"/proc/{p}/cmdline").read_bytes()]
    workers = [w for t in templates for w in _children(t)]
    zygotes = [z for w in workers for z in _children(w)]
    idle = [c for z in zygotes for c in _children(z)]
    return {"server": [server], "template": templates, "workers": workers, "zygotes": zygotes, "idle": idle}


def machine_busy_s() -> float:
    """CPU seconds every CPU of the machine spent not idle (nor waiting for I/O), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


def snapshot(tree: dict[str, list[int]]) -> dict[str, float]:
    out: dict[str, float] = {"executions": 0.0}
    for role in ("server", "template", "workers", "zygotes"):
        out[role] = 0.0
        for pid in tree[role]:
            figures = _stat(pid)
            if figures is None:
                raise SystemExit(f"{role} process {pid} is gone: a worker was replaced during the measurement")
            out[role] += figures[0]
            if role == "zygotes":
                out["executions"] += figures[1]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["client"] = usage.ru_utime + usage.ru_stime
    out["machine"] = machine_busy_s()
    out["wall"] = time.monotonic()
    return out


def setup_cpu_s(server: int) -> tuple[float, int]:
    """Mean CPU of a pre-forked execution that finished its setup and waits for its job (schedstat: ns)."""
    # The last pre-forks may still be setting up: read until their CPU times stop growing (5 s at most).
    deadline, samples = time.monotonic() + 5.0, None
    while True:
        current = {pid: s for pid in replica_tree(server)["idle"] if (s := _schedstat_s(pid)) is not None}
        if (current and current == samples) or time.monotonic() > deadline:
            break
        samples = current
        time.sleep(0.1)
    values = list(current.values())
    return (sum(values) / len(values) if values else float("nan")), len(values)


def measure_ours(url: str, server: int, concurrency: int, duration: float) -> dict:
    tree = replica_tree(server)
    load_start = os.getloadavg()[0]
    before = snapshot(tree)
    figures = asyncio.run(sandbox_bench.run_config(url, "print", concurrency, duration))
    after = snapshot(tree)
    if figures["wrong"] or figures["errors"]:
        raise SystemExit(f"wrong answers or errors: {figures}")
    n = figures["requests"]
    per = {role: (after[role] - before[role]) * 1000 / n for role in ("server", "template", "workers", "zygotes", "executions", "client")}
    per["machine busy"] = (after["machine"] - before["machine"]) * 1000 / n
    setup, samples = setup_cpu_s(server)
    return _row(concurrency, figures, per, load_start, execution_setup_ms=setup * 1000, setup_samples=samples)


def _row(concurrency: int, figures: dict, cpu_ms: dict[str, float], load_start: float, **extra: object) -> dict:
    """One measurement as ``show`` prints it and ``--json`` writes it."""
    keep = ("rps", "p50_ms", "p99_ms")
    return {"concurrency": concurrency, "requests": figures["requests"], **{k: figures[k] for k in keep}, "cpu_ms": cpu_ms, **extra,
            "load": (load_start, os.getloadavg()[0])}


def measure_floor(concurrency: int, duration: float) -> dict:
    load_start = os.getloadavg()[0]
    self_before, kids_before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before = machine_busy_s()
    figures = sandbox_compare.fork_floor(concurrency, duration)
    self_after, kids_after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    n = figures["requests"]

    def cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) * 1000 / n

    cpu_ms = {
        "parent (fork, pipe, reap)": cpu(self_before, self_after),
        "children": cpu(kids_before, kids_after),
        "machine busy": (machine_busy_s() - busy_before) * 1000 / n,
    }
    return _row(concurrency, figures, cpu_ms, load_start)


FLOOR_BESIDE = """
import json, resource, sys
sys.path.insert(0, {bench!r})
import sandbox_compare
sandbox_compare._warm_interpreter()
print("ready", flush=True)
concurrency, duration = json.loads(sys.stdin.readline())
me0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
figures = sandbox_compare.fork_floor(concurrency, duration)
me1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
figures["parent_s"] = me1.ru_utime + me1.ru_stime - me0.ru_utime - me0.ru_stime
figures["children_s"] = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
print(json.dumps(figures), flush=True)
"""


class FloorBeside:
    """The fork floor in a process of its own, warmed (its preload imported) before it is started, so
    that it runs in the same seconds as the servers (``measure_together``)."""

    def __init__(self) -> None:
        script = FLOOR_BESIDE.format(bench=str(Path(__file__).resolve().parent))
        self.process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit("the fork floor's process did not start")

    def start(self, concurrency: int, duration: float) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps([concurrency, duration]) + "\n")
        self.process.stdin.flush()

    def result(self) -> dict:
        assert self.process.stdout is not None
        figures = json.loads(self.process.stdout.readline())
        self.process.wait(timeout=30)
        return figures


def measure_together(servers: list[tuple[str, object, str, int]], concurrency: int, duration: float, *, floor: bool) -> list[tuple[str, dict]]:
    """Every server at once, each driven at ``concurrency`` (and the fork floor beside them with
    ``floor``): the same machine in the same seconds, so a difference in CPU per request is the
    code's, not this VM's drift. The servers' rows count their own processes (``sandbox``) and
    this process, the one client driving them all, split by answered requests (``client``)."""
    trees = {label: replica_tree(server) for label, _process, _url, server in servers}
    beside = FloorBeside() if floor else None
    load_start = os.getloadavg()[0]
    before = {label: snapshot(tree) for label, tree in trees.items()}

    async def drive() -> list[dict]:
        return await asyncio.gather(*(sandbox_bench.run_config(url, "print", concurrency, duration) for _label, _process, url, _server in servers))

    if beside is not None:
        beside.start(concurrency, duration)
    results = asyncio.run(drive())
    after = {label: snapshot(tree) for label, tree in trees.items()}
    answered = sum(figures["requests"] for figures in results)
    client_ms = (after[servers[0][0]]["client"] - before[servers[0][0]]["client"]) * 1000 / answered
    rows = []
    for (label, _process, _url, _server), figures in zip(servers, results, strict=True):
        if figures["wrong"] or figures["errors"]:
            raise SystemExit(f"wrong answers or errors from {label}: {figures}")
        n = figures["requests"]
        per = {role: (after[label][role] - before[label][role]) * 1000 / n for role in ("server", "template", "workers", "zygotes", "executions")}
        per["sandbox"] = sum(per.values())
        per["client"] = client_ms
        rows.append((label, _row(concurrency, figures, per, load_start)))
    if beside is not None:
        figures = beside.result()
        if figures["wrong"]:
            raise SystemExit(f"wrong answers from the fork floor: {figures}")
        n = figures["requests"]
        per = {"parent (fork, pipe, reap)": figures["parent_s"] * 1000 / n, "children": figures["children_s"] * 1000 / n}
        per["floor"] = sum(per.values())
        rows.append(("floor", _row(concurrency, figures, per, load_start)))
    return rows


def show(label: str, row: dict) -> None:
    cpu = row["cpu_ms"]
    parts = "  ".join(f"{k} {v:.2f}" for k, v in cpu.items())
    extra = f"  (execution setup {row['execution_setup_ms']:.2f} of it, {row['setup_samples']} idle samples)" if "execution_setup_ms" in row else ""
    print(
        f"{label:>6} c={row['concurrency']:<2} n={row['requests']:<5} {row['rps']:7.1f} req/s p50 {row['p50_ms']:6.2f} ms p99 {row['p99_ms']:7.2f} ms"
        f" load {row['load'][0]:.2f}->{row['load'][1]:.2f}\n        CPU ms/request: {parts}{extra}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--compare", type=Path, help="also measure the server of this checkout (e.g. a worktree of main), in the same rounds")
    parser.add_argument("--no-floor", action="store_true", help="leave the fork floor out")
    parser.add_argument("--together", action="store_true", help="drive every server and the fork floor at once, each at c=8 (see measure_together)")
    parser.add_argument("--json", help="also write every row here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("the restricted pod way needs root (tests/sandbox/podlike.py)")
    print(f"{os.cpu_count()} CPUs; load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    sandbox_compare._warm_interpreter()
    roots = [("this", sandbox_bench.REPO)] + ([("compare", args.compare.resolve())] if args.compare else [])
    servers: list[tuple[str, object, str, int]] = []
    rows: list[dict] = []
    try:
        for label, root in roots:
            process, url, server = sandbox_bench.start_ours(args.workers, as_pod="pod", code_root=root)
            servers.append((label, process, url, server))
            print(f"{label} ({root}): {sandbox_bench.isolation_summary(url)}", flush=True)
            asyncio.run(sandbox_bench.run_config(url, "print", 16, 2.0))  # warm-up, not measured
        for round_ in range(1, args.rounds + 1):
            if args.together:
                print(f"-- round {round_}, every server at once", flush=True)
                together = measure_together(servers, 8, args.duration, floor=not args.no_floor)
                for label, row in together:
                    show(label, row)
                    rows.append({"server": label, "round": round_, "together": True, **row})
                floor_ms = next((row["cpu_ms"]["floor"] for label, row in together if label == "floor"), None)
                for label, row in together:
                    if floor_ms is not None and label != "floor":
                        ours_ms = row["cpu_ms"]["sandbox"] + row["cpu_ms"]["client"]
                        print(f"   {label}: the floor's CPU per request / ours (sandbox and client) = {floor_ms / ours_ms:.2f}", flush=True)
                continue
            print(f"-- round {round_}", flush=True)
            # The servers in turn, first to last in odd rounds and last to first in even ones: this
            # VM's speed drifts within a round, and a steady drift then cancels over pairs of rounds.
            ordered = servers if round_ % 2 else servers[::-1]
            for concurrency in (1, 16):
                for label, _process, url, server in ordered:
                    row = measure_ours(url, server, concurrency, args.duration)
                    show(label, row)
                    rows.append({"server": label, "round": round_, **row})
                if not args.no_floor:
                    row = measure_floor(concurrency, args.duration)
                    show("floor", row)
                    rows.append({"server": "floor", "round": round_, **row})
    finally:
        for _label, process, _url, server in servers:
            sandbox_bench.stop_ours(process, server)  # type: ignore[arg-type]
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
