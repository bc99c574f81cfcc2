"""A run refused for the operator's batch scheduler: ``retool validate`` names the flag that checks against
another, and following that advice passes (issue 50, item 6: the Volcano example's advice omitted it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, repo_env

CASES = [
    # (example, the flags of the first check, what its message must name, the flags that then pass)
    ("retoolrun-qwen32b-volcano.yaml", [], "--batch-scheduler volcano", ["--batch-scheduler", "volcano"]),
    ("retoolrun-qwen32b-kueue.yaml", ["--batch-scheduler", "volcano"], "--batch-scheduler none", ["--batch-scheduler", "none"]),
]


def validate(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = repo_env()
    env.pop("RETOOL_OPERATOR_BATCH_SCHEDULER", None)
    return subprocess.run([sys.executable, "-m", "retool.cli", "validate", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("example", "first", "named", "then"), CASES, ids=[case[0] for case in CASES])
def test_a_scheduler_refusal_names_the_flag_and_the_flag_it_names_passes(example: str, first: list[str], named: str, then: list[str], tmp_path: Path) -> None:
    path = str(REPO / "examples" / example)
    refused = validate(tmp_path, *first, path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stdout.splitlines()
    assert len(lines) == 1 and named in lines[0], refused.stdout
    passed = validate(tmp_path, *then, path)
    assert passed.returncode == 0, passed.stdout + passed.stderr
