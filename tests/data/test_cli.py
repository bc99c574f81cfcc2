"""`retool data prepare ...` as the operator's prepare stage runs it: a child process, exit codes, run paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from tests.conftest import REPO, repo_env
from tests.data.helpers import dapo_row, read_rows, retool_row, run_document, write_jsonl, write_parquet


def retool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retool.cli", "data", "prepare", *args], env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_prepare_rl_prints_the_summary(tmp_path) -> None:
    source = write_parquet(tmp_path / "dapo.parquet", [dapo_row("P1", "1"), dapo_row("P1", "1"), dapo_row("P2", None)])
    result = retool("rl", "--source", str(source), "--out", str(tmp_path / "rl.parquet"), "--json", "--max-malformed-fraction", "0.5")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)[0]
    assert (summary["rows_read"], summary["rows_written"], summary["duplicates"], summary["malformed"]) == (3, 1, 1, 1)
    assert summary["malformed_examples"][0]["reason"] == "missing reward_model.ground_truth"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["rl", "--source", "/nonexistent/dapo.parquet", "--out", "{tmp}/rl.parquet"], "no such file or directory", id="missing source"),
        pytest.param(["eval", "--source", "{tmp}/bad.jsonl", "--out", "{tmp}/e.parquet", "--name", "aime_2024"], "no valid rows", id="no valid row"),
        pytest.param(["all", "--spec", "{tmp}/missing.yaml"], "missing.yaml", id="missing spec"),
        pytest.param(["all", "--spec", "{tmp}/invalid.yaml"], "metadata.name", id="invalid spec"),
    ],
)
def test_errors_exit_1_and_write_nothing(tmp_path, args: list[str], message: str) -> None:
    write_jsonl(tmp_path / "bad.jsonl", ["{nope"])
    (tmp_path / "invalid.yaml").write_text("apiVersion: retool.dev/v1alpha1\nkind: RetoolRun\nmetadata: {name: Bad_Name}\nspec: {storage: {pvc: {claimName: c}}}\n")
    result = retool(*[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 1
    assert message in result.stderr
    assert not list(tmp_path.glob("*.parquet"))


def test_prepare_all_writes_every_output_at_the_run_paths(tmp_path) -> None:
    sources = tmp_path / "sources"
    write_jsonl(sources / "sft.jsonl", [retool_row(), retool_row()])
    write_parquet(sources / "dapo" / "part-0.parquet", [dapo_row(f"P{i % 3}", str(i % 3)) for i in range(9)])
    write_parquet(sources / "aime24.parquet", [{"ID": "a", "Problem": "Find x.", "Answer": 1}])
    write_jsonl(sources / "aime25.jsonl", [{"problem": "Find y.", "answer": "2"}])
    eval_sets = [{"name": "aime_2024", "source": str(sources / "aime24.parquet")}, {"name": "aime_2025", "source": str(sources / "aime25.jsonl")}]
    document = run_document(tmp_path / "pvc", {"sft": str(sources / "sft.jsonl"), "rl": str(sources / "dapo"), "eval": eval_sets}, claim="retool-data")
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(document))
    result = retool("all", "--spec", str(spec))
    assert result.returncode == 0, result.stderr
    paths = run_paths(parse_run(document))
    assert Path(paths.sft_train).is_relative_to(tmp_path / "pvc" / "team-a" / "demo")
    assert len(read_rows(Path(paths.sft_train))) == 2
    assert len(read_rows(Path(paths.rl_train))) == 3
    assert [r["data_source"] for r in read_rows(Path(paths.eval_set("aime_2024")))] == ["aime_2024"]
    assert [r["reward_model"]["ground_truth"] for r in read_rows(Path(paths.eval_set("aime_2025")))] == ["2"]
    summaries = json.loads((Path(paths.data) / "prepare-summary.json").read_text())
    assert [s["kind"] for s in summaries] == ["sft", "rl", "eval:aime_2024", "eval:aime_2025"]
    assert "rl: " in result.stdout and "written 3, duplicates 6" in result.stdout


def test_prepare_all_skips_sft_when_disabled(tmp_path) -> None:
    write_parquet(tmp_path / "dapo.parquet", [dapo_row("P", "1")])
    write_parquet(tmp_path / "aime.parquet", [{"Problem": "Find x.", "Answer": 1}])
    data = {"sft": "/does/not/exist.jsonl", "rl": str(tmp_path / "dapo.parquet"), "eval": [{"name": "aime_2024", "source": str(tmp_path / "aime.parquet")}]}
    document = run_document(tmp_path / "pvc", data, name="nosft", namespace=None, claim="c", sft={"enabled": False})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(document))
    result = retool("all", "--spec", str(tmp_path / "run.yaml"))
    assert result.returncode == 0, result.stderr
    paths = run_paths(parse_run(document))
    assert Path(paths.rl_train).exists() and not Path(paths.sft_train).exists()
