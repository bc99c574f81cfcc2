"""`make test` first checks that TMPDIR has the room the suite writes: a disk that fills midway fails
tests far from the cause (a fixture's "No space left on device", a Ray job whose supervisor dies),
as it did on a CI machine that shared its disk with the runs before it. The check reads `df` of the
same TMPDIR the tests will use and names it, the free figure and the knob."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO


def disk_room(tmpdir: str, need_gb: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKEFLAGS": "", "TMPDIR": tmpdir}
    return subprocess.run(["make", "-s", "disk-room", f"TEST_TMP_GB={need_gb}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_make_test_checks_the_room_in_tmpdir_first() -> None:
    prerequisites = re.search(r"^test:([^#\n]*)", (REPO / "Makefile").read_text(), re.M)
    assert prerequisites and prerequisites.group(1).split()[-1] == "disk-room"  # after the installs, before pytest


def test_a_tmpdir_without_the_room_is_refused_naming_it_and_its_free_space(tmp_path: Path) -> None:
    free_gb = shutil.disk_usage(tmp_path).free // (1 << 30)  # the disk is shared: it may move by a GB meanwhile
    short = disk_room(str(tmp_path), free_gb + 2)
    assert short.returncode != 0
    said = re.search(rf"error: {re.escape(str(tmp_path))} has (\d+) GB free; .* needs {free_gb + 2} GB free \(TEST_TMP_GB\)", short.stderr)
    assert said and abs(int(said.group(1)) - free_gb) <= 1, short.stderr
    enough = disk_room(str(tmp_path), max(free_gb - 2, 0))
    assert enough.returncode == 0, enough.stderr


def test_a_tmpdir_that_is_not_there_is_refused(tmp_path: Path) -> None:
    missing = disk_room(str(tmp_path / "missing"), 0)
    assert missing.returncode != 0 and f"TMPDIR {tmp_path / 'missing'} is not a folder df can read" in missing.stderr
