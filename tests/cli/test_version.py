"""``retool --version`` is what a bug report quotes; an unexpected exception ends with it too."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, repo_env


def _project_version() -> str:
    found = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert found, "pyproject.toml has no version line"
    return found.group(1)


def test_version_prints_the_project_version_python_and_platform(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "retool.cli", "--version"], cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(rf"retool {re.escape(_project_version())} \(Python \d+\.\d+\.\d+, Linux \S+\)\n", proc.stdout), proc.stdout


def test_an_unexpected_exception_is_reported_as_a_bug_with_the_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from retool import cli
    from retool.cli import validate

    def broken(_args: argparse.Namespace) -> int:
        raise RuntimeError("a bug deep inside validate")

    monkeypatch.setattr(validate, "run", broken)
    assert cli.main(["validate", str(REPO / "examples/retoolrun-minimal.yaml")]) == cli.BUG_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug deep inside validate" in err
    assert err.rstrip().splitlines()[-1].startswith(f"retool validate: unexpected error: this is a bug in retool {_project_version()} (Python ")
