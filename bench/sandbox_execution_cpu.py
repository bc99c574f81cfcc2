"""One execution process alone, no HTTP and no server: its CPU and copy-on-write faults, by phase.

    python bench/sandbox_execution_cpu.py [--executions 300]

Builds the chain a worker uses (this process warms up as the template does: preload, warm-up,
``gc.freeze``, huge pages; a forked worker-like process starts a real ``Zygote`` with the layers of
the restricted pod: one uid for every execution, Landlock at the kernel's ABI, the seccomp filter)
and runs ``print(1+1)`` in ``--executions`` pre-forked execution processes one after the other, as a
worker does: fork (reaping the last one in the same round trip), wait for the acknowledgement, send
the job, read the output, ``wait``. Per execution it reads:

- ``setup``: the execution process's CPU (/proc/<pid>/schedstat, ns) and minor faults when it has
  acknowledged its setup (detach, descriptors, limits of its own, Landlock, seccomp, stdio, numpy
  reseed) and waits for its job;
- ``execution``: its whole CPU from the fork to its exit's teardown (``wait4``), so ``execution -
  setup`` is the job itself and the exit;
- ``zygote``: the zygote's own CPU and faults per execution (the fork of the warm interpreter, the
  round trips, the reaping; /proc/<pid>/stat ticks, so only the mean over many is meaningful).

Then the fork floor of ``sandbox_compare`` for reference: this process forking a child that runs
the code with stdout on a pipe (``children``: fork return to exit; ``parent``: the fork itself,
the pipe, the reap). Run as root (Landlock needs no privilege, but the bench mirrors the pod's
single uid with the caller's own). CPU figures scale with the machine's load: compare rows of one
sitting only; the fault counts do not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sandbox_compare

from retool.sandbox import forking, isolation, landlock, protocol, template, worker, zygote
from retool.sandbox.settings import DEFAULT_PRELOAD

TICK = os.sysconf("SC_CLK_TCK")
JOB = {
    "code": "print(1+1)\n",
    "stdin": None,
    "limits": {"run_timeout_s": 10.0, "memory_limit_mb": 1024, "max_processes": 64, "max_file_size_mb": 64, "max_open_files": 256},
    "processes_in_use": 0,
}


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _schedstat_ms(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return data


def worker_like(executions: int, scratch: Path, report: int, native_setup: bool = True) -> None:
    """In a process forked from the warm one, as a worker: a zygote, then one execution at a time."""
    abi = landlock.kernel_abi()
    read_paths = landlock.read_paths([*worker.SYSTEM_READ_PATHS, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path], [str(scratch)])
    layers = {
        "drop": "none", "uid": os.getuid(), "gid": os.getgid(), "landlock_abi": abi, "read_paths": list(read_paths), "seccomp": True,
        "signals_scoped": abi >= 6, "deny_chmod": True, "dumpable": True, "protect_parent": False, "native_setup": native_setup,
    }  # fmt: skip
    zyg = zygote.Zygote(False, layers=layers)
    job = protocol.MARSHAL.dumps(JOB)  # as the worker writes it
    rows = []
    warm_up = 10
    for i in range(executions + warm_up):
        cwd = scratch / f"x{i}"
        cwd.mkdir()
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ack_r, ack_w = os.pipe()
        before = _stat(zyg.pid)
        pid, _baseline, _left = zyg.fork(str(cwd), go_r, out_w, err_w, ack_w, reap_first=i > 0)
        for fd in (go_r, out_w, err_w, ack_w):
            os.close(fd)
        if os.read(ack_r, 1) != b"k":
            raise SystemExit(f"the execution failed its setup: {_read_all(err_r).decode(errors='replace')[-2000:]}")
        os.close(ack_r)
        setup_ms, setup_faults = _schedstat_ms(pid), int(_stat(pid)[7])
        os.write(go_w, job)
        os.close(go_w)
        output = _read_all(out_r)
        ended = zyg.wait(pid)
        after = _stat(zyg.pid)
        if output != b"2\n":
            raise SystemExit(f"wrong output {output!r}: {_read_all(err_r).decode(errors='replace')[-2000:]}")
        os.close(out_r)
        os.close(err_r)
        cwd.rmdir()
        if i >= warm_up:
            own = (int(after[11]) + int(after[12]) - int(before[11]) - int(before[12])) * 1000 / TICK
            rows.append((setup_ms, setup_faults, ended.cpu_seconds * 1000, own, int(after[7]) - int(before[7])))
    zyg.close()
    os.write(report, json.dumps(rows).encode())


def floor(executions: int) -> tuple[float, float, float, float]:
    """(children CPU ms, children faults, parent CPU ms, parent faults) per execution of the fork floor."""
    code = compile(JOB["code"], "main.py", "exec")
    kids0, me0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(executions):
        r, w = os.pipe()
        pid = sandbox_compare.fork_child(code, r, w)
        _read_all(r)
        os.close(r)
        os.waitpid(pid, 0)
    kids1, me1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)

    def cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) * 1000 / executions

    return cpu(kids0, kids1), (kids1.ru_minflt - kids0.ru_minflt) / executions, cpu(me0, me1), (me1.ru_minflt - me0.ru_minflt) / executions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=300)
    parser.add_argument("--setup", choices=("native", "python"), default="native", help="the execution's setup: the compiled helper (where built) or Python")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    template.load(list(DEFAULT_PRELOAD))
    gc.collect()
    forking.locate()  # as the template does, before the freeze
    gc.freeze()
    isolation.collapse_to_huge_pages()
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"retool-execution-cpu-{os.getpid()}"
    scratch.mkdir(mode=0o700)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            worker_like(args.executions, scratch, write_end, args.setup == "native")
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = _read_all(read_end)
    _, status = os.waitpid(pid, 0)
    scratch.rmdir()
    if status:
        return 1
    rows = json.loads(data)

    def median(k: int) -> float:
        return statistics.median(row[k] for row in rows)

    def mean(k: int) -> float:
        return statistics.mean(row[k] for row in rows)

    print(f"execution setup:  {median(0):6.2f} ms CPU (median), {median(1):5.0f} faults")
    print(f"execution whole:  {mean(2):6.2f} ms CPU (mean; job and exit: {mean(2) - mean(0):.2f})")
    print(f"zygote per fork:  {mean(3):6.2f} ms CPU (mean), {median(4):5.0f} faults")
    kids, kid_faults, parent, parent_faults = floor(args.executions)
    print(f"floor child:      {kids:6.2f} ms CPU (mean), {kid_faults:5.0f} faults;  floor parent: {parent:.2f} ms, {parent_faults:.0f} faults")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
