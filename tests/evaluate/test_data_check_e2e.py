"""``retool data check`` against the real sandbox: the shipped samples pass, tampered copies do not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retool.data_check.app import CheckConfig, run_check
from retool.data_check.compare import ERROR_MATCH, MATCH, MISMATCH
from retool.demo.samples import SFT_FILE, SFT_SOURCES
from tests.conftest import repo_env

pytestmark = pytest.mark.slow

RECORDED_TRACEBACK = 'Traceback (most recent call last):\n  File "/sandbox/main.py", line 1\nNameError: name \'undefined_name\' is not defined'


def rows():
    return [json.loads(line) for line in SFT_FILE.read_text().splitlines()]


def write(path, data):
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


async def test_shipped_samples_reproduce_exactly(sandbox, tmp_path):
    outcome = await run_check(CheckConfig(file=SFT_FILE, out_dir=tmp_path / "report", sandbox_url=sandbox.base_url, concurrency=4))
    report = outcome.report
    assert report.ok, report.problems()
    blocks = sum(len(s.parts) // 2 for s in SFT_SOURCES)
    metrics = report.metrics()
    assert metrics["data_check/blocks"] == blocks
    assert metrics["data_check/output_agreement"] == 1.0
    assert metrics["data_check/answer_accuracy"] == 1.0
    assert metrics["data_check/answers_scored"] == len(SFT_SOURCES)
    verdicts = [s.verdict for t in report.trajectories for s in t.steps]
    assert set(verdicts) == {MATCH}, "the samples' outputs were produced by this sandbox, so they match exactly"
    # The trajectory that calls an undefined function records (and reproduces) the NameError.
    assert any("NameError" in (s.actual or "") for t in report.trajectories for s in t.steps)
    saved = json.loads(outcome.json_path.read_text())
    assert saved["ok"] is True and len(saved["trajectories"]) == len(SFT_SOURCES)
    assert "Verdict: **OK**" in outcome.markdown_path.read_text()


async def test_tampered_output_wrong_answer_and_bad_row_are_reported(sandbox, tmp_path):
    data = rows()
    data[0]["messages"][1]["content"] = data[0]["messages"][1]["content"].replace("[2, 3] 400", "[2, 3] 401", 1)
    data[1]["answer"] = "16"
    data.append({"text": "not a trajectory"})
    path = write(tmp_path / "tampered.jsonl", data)
    report = (await run_check(CheckConfig(file=path, out_dir=tmp_path / "report", sandbox_url=sandbox.base_url))).report
    assert not report.ok
    first = report.trajectories[0]
    assert [s.verdict for s in first.steps] == [MISMATCH]
    assert "-[2, 3] 401" in first.steps[0].diff and "+[2, 3] 400" in first.steps[0].diff
    assert report.trajectories[1].acc is False and report.trajectories[1].pred == "15"
    assert report.unreadable == ["row 4: missing 'messages' (a list of chat messages)"]
    problems = "\n".join(report.problems())
    assert "row 0 block 0: output differs" in problems
    assert "row 1: final answer '15' is wrong (expected '16')" in problems


async def test_multi_turn_parquet_and_error_outputs(sandbox, tmp_path):
    """Already multi-turn data in parquet (tool_calls + tool messages, arguments stored as a struct);
    a traceback recorded by another sandbox still agrees when the exception is the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def call(code):
        return {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}

    row = {
        "messages": [
            {"role": "user", "content": "What is 2 + 2?", "tool_calls": None},
            {"role": "assistant", "content": "Try.", "tool_calls": [call("print(undefined_name)")]},
            {"role": "tool", "content": RECORDED_TRACEBACK, "tool_calls": None},
            {"role": "assistant", "content": "Again.", "tool_calls": [call("2 + 2")]},
            {"role": "tool", "content": "4", "tool_calls": None},
            {"role": "assistant", "content": "\\boxed{4}", "tool_calls": None},
        ],
        "reward_model": {"ground_truth": "4"},
    }
    path = tmp_path / "multi.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    report = (await run_check(CheckConfig(file=path, out_dir=tmp_path / "r", sandbox_url=sandbox.base_url))).report
    assert [s.verdict for s in report.trajectories[0].steps] == [ERROR_MATCH, MATCH]
    assert report.trajectories[0].acc is True
    assert report.ok


@pytest.mark.parametrize(
    ("tamper", "code"),
    [(False, 0), (True, 1)],
    ids=["clean samples exit 0", "a mismatch exits 1"],
)
def test_check_command_exit_code(sandbox, tmp_path, tamper, code):
    data = rows()
    if tamper:
        data[3]["messages"][1]["content"] = data[3]["messages"][1]["content"].replace("<interpreter>\n19", "<interpreter>\n20", 1)
    path = write(tmp_path / "sft.jsonl", data)
    command = [sys.executable, "-m", "retool.cli", "data", "check", str(path), "--sandbox-url", sandbox.base_url, "--out", str(tmp_path / "out")]
    done = subprocess.run(command, env=repo_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == code, done.stdout + done.stderr
    assert (tmp_path / "out" / "report.md").exists()
    assert "4 trajectories" in done.stdout
