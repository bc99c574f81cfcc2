"""The test head's restart (``RayHead.ensure_running``), which the end-to-end RayJob scenarios lean on: a head
that lost one of its processes is gone as a whole, and comes back on the same address."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.ray.head import ray_head


def _raylet_pid(logs: Path) -> int:
    """The raylet's pid, from the head's own process list (``ps``-free: /proc)."""
    session = logs.parent.resolve()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"/raylet") and any(str(session).encode() in arg for arg in cmdline):
            return int(entry.name)
    raise AssertionError(f"no raylet of {session} among this machine's processes")


def test_a_head_that_lost_its_raylet_exits_whole_and_starts_again_on_the_same_address(tmp_path: Path) -> None:
    with ray_head(tmp_path) as head:
        assert head.ensure_running() == ""  # running: nothing to do, nothing to report
        os.kill(_raylet_pid(head.logs), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while head.process.alive():  # ``ray start --block`` notices within a second and ends every process
            assert time.monotonic() < deadline, "the head outlived its raylet by 60 s"
            time.sleep(0.2)
        assert not head.jobs_api_answers()
        report = head.ensure_running()
        assert "exited unexpectedly" in report and "raylet" in report, report  # ray start's own account of which
        assert head.jobs_api_answers()
