"""`make help` lists every target a user can run: each phony target of the Makefile (and any other
target that is not a file) is in its output, by name or by the pattern of a rule over generated
names (`image-<name>`). The Makefile's targets come from make's own database (`make -pRrq`), so
a target added without a `## ` comment fails here."""

from __future__ import annotations

import os
import re
import subprocess

from tests.conftest import REPO

ENV = {**os.environ, "MAKEFLAGS": ""}


def make_targets() -> set[str]:
    """The phony targets, and every other target whose name is not a file path (make's database, expanded)."""
    database = subprocess.run(["make", "-pRrq", "-f", "Makefile"], cwd=REPO, capture_output=True, text=True, env=ENV, timeout=60).stdout
    phony = {name for line in database.splitlines() if line.startswith(".PHONY:") for name in line.split()[1:]}
    rules = {m.group(1) for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9_-]*):", database, re.M) if not (REPO / m.group(1)).exists()}
    return phony | rules


def help_entries() -> list[str]:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, env=ENV, timeout=60, check=True).stdout
    return re.findall(r"^  make (\S+)\s+\S", out, re.M)


def listed(target: str, entries: list[str]) -> bool:
    return any(re.fullmatch(re.escape(entry).replace(re.escape("<name>"), "[a-z0-9-]+"), target) for entry in entries)


def test_make_help_lists_every_target() -> None:
    targets, entries = make_targets(), help_entries()
    assert {"help", "install", "test", "demo", "chart", "image-operator"} <= targets, "make's database was not read"
    assert sorted(t for t in targets if not listed(t, entries)) == [], "give these targets a `## ` comment in the Makefile"


def test_every_help_entry_is_a_target() -> None:
    targets = make_targets()
    assert [entry for entry in help_entries() if not any(listed(t, [entry]) for t in targets)] == []
