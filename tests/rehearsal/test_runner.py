"""The rehearsal runner's pod boundary and its reading of verl's console log (``retool.rehearsal.runner``).

A stage attempt must end as a deleted pod ends: with every process it started, including those
that left its session (torchrun starts each rank with ``start_new_session``, torch 2.13
``subprocess_handler.py``), or the next attempt would train beside the last one's ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from retool.rehearsal.runner import POD_MARK, STEP_LINE, Machine, end_pod, pod_processes, pod_rss_mb, run_attempt
from retool.runtime.context import StageContext

# A parent like torchrun: its child leaves the session (setsid), ignores SIGTERM and holds ~60 MB.
TREE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); x = bytearray(60 << 20); print('ready', flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for an init that may reap it late)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_tree(mark: str) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", TREE], env={**os.environ, POD_MARK: mark}, stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(parent.stdout.readline())
    return parent, child


def test_an_ended_attempt_leaves_no_process_even_one_in_its_own_session_that_ignores_sigterm() -> None:
    mark = uuid.uuid4().hex
    parent, child = start_tree(mark)
    assert set(pod_processes(mark)) == {parent.pid, child}
    assert os.getsid(child) != os.getsid(parent.pid), "the child left the attempt's session, as torchrun's ranks do"
    started = time.monotonic()
    end_pod(parent, mark, grace=1.0)
    assert pod_processes(mark) == []
    assert time.monotonic() - started < 30, "SIGKILL follows the grace period"
    assert not running(child)


def test_an_attempts_memory_counts_the_processes_outside_its_session() -> None:
    mark = uuid.uuid4().hex
    parent, _child = start_tree(mark)
    try:
        assert pod_rss_mb(mark) > 60
    finally:
        end_pod(parent, mark, grace=1.0)


def test_processes_of_another_attempt_are_not_this_ones() -> None:
    mark, other = uuid.uuid4().hex, uuid.uuid4().hex
    parent, _child = start_tree(mark)
    try:
        assert pod_processes(other) == []
    finally:
        parent.send_signal(signal.SIGKILL)
        end_pod(parent, mark, grace=1.0)


@pytest.mark.parametrize(
    ("line", "steps"),
    [
        # verl 0.9.1's SFT trainer, its tqdm bar and its console logger on one line (a rehearsal's log)
        ("Epoch 1/40:  75%|███████▌  | 3/4 [00:04<00:01,  1.38s/it]step:4 - perf/max_memory_allocated_gb:1.87 - train/loss:11.5 - train/lr:0.003", ["4"]),
        # the PPO trainer's console logger, as Ray prefixes it, with global_step and timing_s/step further on
        ("\x1b[36m(RetoolTaskRunner pid=8891)\x1b[0m step:2 - global_seqlen/min:10233 - training/global_step:2 - timing_s/step:87.27 - perf/x:1", ["2"]),
        ("step:160 - val/loss:0.031", ["160"]),
        ("training/global_step:1 - timing_s/step:3.2 - ", []),
        ("Saving checkpoint to: /claim/checkpoints/sft/global_step_78", []),
    ],
)
def test_step_lines_of_verls_console_logger(line: str, steps: list[str]) -> None:
    assert [m.group(1) for m in STEP_LINE.finditer(line)] == steps


def test_a_machine_of_one_thread_gives_torch_one_thread_in_every_stage_process(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a shared machine a rank's second torch thread waits on the first at every op (SFT ran ~7x slower
    beside the rest of `make test`): ``Machine.threads`` reaches torch itself in the stage's processes."""
    probe = "import torch; print('threads', torch.get_num_threads())"
    fake = tmp_path / "python3"  # stands for the trainer image's interpreter: what `python3 -m retool.stage` starts
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{probe}\"\n")
    fake.chmod(0o755)
    spec = tmp_path / "run.yaml"
    spec.write_text("{}")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    default = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()[-1]
    if default == "1":
        pytest.skip("a one-core machine: torch's default is already one thread")
    ctx = StageContext(run_name="r", namespace="default", sandbox_url="http://127.0.0.1:1")
    for threads, expected in ((1, "1"), (None, default)):
        attempt = run_attempt("sft", ctx, spec, Machine(fake, threads=threads), tmp_path / f"logs-{threads}")
        assert attempt.status == 0
        assert f"threads {expected}" in attempt.log.read_text(), (threads, attempt.log.read_text())
