"""The preflight as the operator will run it (``python3 -m retool.stage preflight`` in a pod), and
``retool preflight`` logging its report to MLflow.

The stage entry renders the preflight command, runs it and exits with its status; the report lands
beside the rendered command in ``stages/preflight-<attempt>/`` on the PVC. (A passing preflight
runs in-process for every example in ``test_examples``; here the cheap failure shows the path, and a
text-only run passes with the environment the operator gives it: no sandbox URL.) (With a parent MLflow
run in the stage context the entry also opens the attempt's MLflow run, named after the stage's
child object: that needs ``preflight`` among ``retool.spec.names.STAGES``, which the operator's
stage machine adds; here the stage runs untracked.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from retool.cli import main
from retool.preflight.checks import BY_NAME
from retool.preflight.report import REPORT_JSON, REPORT_MD
from retool.preflight.steps import TEXT_ONLY_SANDBOX, TEXT_ONLY_TOOLS
from retool.preflight.tracking import TAG_FAILURE, TAG_VERDICT
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from retool.tracking._client import client
from tests.conftest import repo_env
from tests.preflight.conftest import PreparedRun

pytestmark = pytest.mark.slow


def stage_pod(prepared: PreparedRun, model: str, sandbox: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the stage entry as the operator's Job does, for a copy of the run whose model is ``model``
    (``sandbox`` empty: no ``RETOOL_SANDBOX_URL``, as for a text-only run)."""
    document = yaml.safe_load(prepared.spec_file.read_text())
    document["spec"]["model"]["base"] = model
    document["spec"]["eval"]["samplesPerProblem"] = 4
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(document))
    run = parse_run(document)
    ctx = StageContext(run_name=run.metadata.name, namespace="retool", sandbox_url=sandbox)
    proc = subprocess.run(
        [sys.executable, "-m", "retool.stage", "preflight", "--spec", str(spec)], env=repo_env(**ctx.to_env()), capture_output=True, text=True, timeout=600, check=False
    )
    return proc, Path(run_paths(run).stage_files) / "preflight-1"


def test_a_failing_preflight_stage_exits_with_its_checks_code_and_says_why(prepare: Callable[[str], PreparedRun], sandbox: str, tmp_path: Path) -> None:
    empty_model = tmp_path / "model"
    empty_model.mkdir()
    proc, report_dir = stage_pod(prepare("qwen7b-ascend"), str(empty_model), sandbox, tmp_path)
    assert proc.returncode == BY_NAME["tokenizer"].exit_code, proc.stderr[-3000:]
    assert f"preflight check tokenizer failed: the tokenizer did not load: {empty_model} has no tokenizer files" in proc.stderr
    report = json.loads((report_dir / REPORT_JSON).read_text())
    assert report["exit_code"] == BY_NAME["tokenizer"].exit_code and report["stages"] == ["sft", "rl", "eval"]
    assert "python3 -m retool.runtime.cpu_only -m retool.preflight" in (report_dir / "command.sh").read_text().replace(" \\\n    ", " ")
    assert (report_dir / REPORT_MD).read_text().startswith("# Preflight of retool/qwen7b-ascend: FAILED (exit 11)")
    statuses = {c["check"] for c in report["checks"] if c["status"] == "passed"}
    assert {"config", "tools", "sandbox"} <= statuses, "checks that do not need the tokenizer still run"


def test_a_text_only_preflight_stage_passes_without_a_sandbox_url(prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, tmp_path: Path) -> None:
    proc, report_dir = stage_pod(prepare("qwen32b-h200-text-only"), qwen_tokenizer, "", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((report_dir / REPORT_JSON).read_text())
    assert report["passed"] and report["recipe"] == "text-only" and report["sandbox_url"] is None and report["stages"] == ["rl", "eval"]
    skipped = {c["check"]: c["summary"] for c in report["checks"] if c["status"] == "skipped"}
    no_config = f"no config.json at {qwen_tokenizer}: the model's context window, heads and memory were not checked"
    assert skipped == {"tools": TEXT_ONLY_TOOLS, "sandbox": TEXT_ONLY_SANDBOX, "model": no_config}


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from retool.embedded.servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server.base_url


def test_retool_preflight_logs_its_verdict_and_report_to_an_mlflow_run_of_its_own(
    prepare: Callable[[str], PreparedRun], sandbox: str, mlflow: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prepared = prepare("qwen7b-ascend")
    code = main(["preflight", str(prepared.spec_file), "--tokenizer", str(tmp_path), "--sandbox-url", sandbox, "--report-dir", str(tmp_path / "report"), "--mlflow-uri", mlflow])
    assert code == BY_NAME["tokenizer"].exit_code
    assert "preflight of retool/qwen7b-ascend FAILED: preflight check tokenizer failed" in capsys.readouterr().out
    mlflow_client = client(mlflow)
    experiment = mlflow_client.get_experiment_by_name("retool/qwen7b-ascend")
    (run,) = mlflow_client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'qwen7b-ascend-preflight'")
    assert run.info.status == "FAILED" and run.data.tags[TAG_VERDICT] == "failed"
    assert run.data.tags[TAG_FAILURE].startswith(f"preflight check tokenizer failed: the tokenizer did not load: {tmp_path} has no tokenizer files")
    assert run.data.metrics["preflight/exit_code"] == BY_NAME["tokenizer"].exit_code and run.data.metrics["preflight/failed_checks"] == 1
    assert {a.path for a in mlflow_client.list_artifacts(run.info.run_id, "preflight")} == {f"preflight/{REPORT_JSON}", f"preflight/{REPORT_MD}"}
