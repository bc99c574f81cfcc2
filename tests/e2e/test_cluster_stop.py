"""`python -m upstream.cluster` leaves nothing running: SIGTERM or SIGINT stops what it started (up or still
starting), and when it is killed outright the kernel kills its components (PR_SET_PDEATHSIG). Checked by
pid: the processes it started are the ones whose parent it was, found in /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, repo_env
from tests.e2e.conftest import eventually

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads children from /proc (Linux)")


def children_of(pid: int) -> dict[int, str]:
    """{pid: command name} of the live processes whose parent is ``pid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            found[int(entry.name)] = name
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


@pytest.mark.parametrize(
    ("sig", "when"),
    [(signal.SIGTERM, "up"), (signal.SIGINT, "starting"), (signal.SIGKILL, "starting")],
    ids=["SIGTERM once the control plane is up", "SIGINT while it starts", "SIGKILL while it starts (parent-death signal)"],
)
def test_a_stopped_or_killed_cluster_leaves_no_component_running(tmp_path: Path, sig: signal.Signals, when: str) -> None:
    out = tmp_path / "cluster.out"
    with out.open("wb") as sink:
        cluster = subprocess.Popen([sys.executable, "-m", "upstream.cluster", "--workdir", str(tmp_path / "plane")], cwd=REPO,
                                   env=repo_env(), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    started: dict[int, str] = {}
    try:
        def ready() -> bool:
            if cluster.poll() is not None:
                pytest.fail(f"upstream.cluster exited ({cluster.returncode}):\n{out.read_text()[-3000:]}")
            started.update(children_of(cluster.pid))
            return "control plane up" in out.read_text() if when == "up" else len(started) >= 2
        eventually(f"upstream.cluster {when}", ready, timeout=600, interval=0.2)
        started.update(children_of(cluster.pid))
        assert {"etcd", "kube-apiserver"} <= set(started.values()), started
        cluster.send_signal(sig)
        cluster.wait(120)
        if sig != signal.SIGKILL:
            assert cluster.returncode == 0, out.read_text()[-3000:]
        eventually("every component gone", lambda: not [p for p in started if alive(p)], timeout=60,
                   show=lambda: {p: n for p, n in started.items() if alive(p)})
    finally:
        for pid in started:  # only the pids this test saw it start
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait(10)
