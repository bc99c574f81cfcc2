"""`retool eval` without `--out` writes under build/, named after what it evaluated, never loose
into the working directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from retool.cli.eval import default_out
from retool.embedded.process import free_port
from tests.conftest import repo_env


@pytest.mark.parametrize(
    ("model", "data", "out"),
    [
        ("retool-32b", "aime_2024.parquet", "build/eval/retool-32b-aime_2024.jsonl"),
        ("Qwen/Qwen2.5-7B-Instruct", "/data/eval/aime_2025.jsonl", "build/eval/Qwen-Qwen2.5-7B-Instruct-aime_2025.jsonl"),
    ],
    ids=["a served name and a local file", "a hub id's slash does not make a folder"],
)
def test_the_default_results_file_is_under_build_and_names_model_and_data(model: str, data: str, out: str) -> None:
    assert default_out(model, Path(data)) == Path(out)


def test_retool_eval_without_out_leaves_the_working_directory_clean(tmp_path: Path) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    unreachable = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "retool.cli", "eval", "--endpoint", unreachable, "--model", "nope", "--data", str(problems), "--sandbox-url", unreachable],
        cwd=work, env=repo_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # the sample could not complete: documented as 1
    assert sorted(p.name for p in work.iterdir()) == ["build"]
    assert sorted(p.name for p in (work / "build" / "eval").iterdir()) == ["nope-problems.jsonl", "nope-problems.summary.json"]
    assert json.loads((work / "build" / "eval" / "nope-problems.summary.json").read_text()) == {"eval/samples": 1.0, "eval/errors": 1.0}
