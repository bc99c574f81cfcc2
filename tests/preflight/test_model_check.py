"""The preflight's ``model`` check on small model directories: config.json beside the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from retool.preflight.model import check_model
from retool.spec.validate import parse_run
from tests.conftest import REPO
from tests.spec.test_model_fit import QWEN_7B


class Tokenizer:
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def spec(**rl: object):
    doc = yaml.safe_load((REPO / "examples" / "retoolrun-qwen7b-ascend.yaml").read_text())
    doc["spec"]["rl"].update(rl)
    return parse_run(doc).spec


def model_dir(tmp_path: Path, config: dict | str | None) -> str:
    d = tmp_path / "model"
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(d)


@pytest.mark.parametrize(
    ("config", "rl", "tokens", "status", "fragment"),
    [
        pytest.param(QWEN_7B, {}, 151665, "passed", "22528 tokens fit the 32768-token window; 28 heads split", id="the 7B example fits its model"),
        pytest.param(None, {}, 151665, "skipped", "no config.json at", id="tokenizer files only: skipped with the reason"),
        pytest.param("{", {}, 151665, "failed", "is not JSON", id="a broken config.json fails"),
        pytest.param(QWEN_7B, {"tensorParallel": 8}, 151665, "failed", "spec.rl.tensorParallel: 8 does not split the model's 28 attention heads", id="heads vs tensor parallel"),
        pytest.param(QWEN_7B, {}, 152100, "failed", "the tokenizer has 152100 tokens but the model's embedding has 152064 rows", id="tokenizer above the embedding"),
    ],
)  # fmt: skip
def test_check_model(tmp_path: Path, config: dict | str | None, rl: dict, tokens: int, status: str, fragment: str) -> None:
    result = check_model(spec(**rl), model_dir(tmp_path, config), Tokenizer(tokens))
    assert (result.check, result.status) == ("model", status)
    assert fragment in result.summary, result.summary


def test_the_passing_check_reports_the_rollout_memory_arithmetic(tmp_path: Path) -> None:
    result = check_model(spec(), model_dir(tmp_path, QWEN_7B), Tokenizer(151665))
    memory = result.details["rollout_memory_gib"]
    assert memory["device_gib"] == 64.0 and memory["weights_gib"] == pytest.approx(7.1, abs=0.1)
    assert "rollout weights 7.1 GiB of 57.6 GiB per device" in result.summary
    assert "the actor update 47.0 GiB and log-probabilities 47.9 GiB of 64.0 GiB" in result.summary, result.summary
    assert memory["update_phase_gib"] < 64.0 and memory["log_prob_phase_gib"] < 64.0


def test_a_run_whose_actor_update_cannot_fit_fails_with_the_arithmetic(tmp_path: Path) -> None:
    result = check_model(spec(maxResponseLength=30000, offload=False), model_dir(tmp_path, QWEN_7B), Tokenizer(151665))
    assert result.status == "failed", result.summary
    assert "spec.rl.offload: the rollout phase does not fit one device (ascend): vLLM gpuMemoryUtilization 0.9 x 64.0 GiB = 57.6 GiB" in result.summary
    assert "actor kept on the device (offload: false) 16 B x 7.6B params / 8 devices = 14.2 GiB" in result.summary


def test_model_warnings_are_reported_as_warnings_never_as_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a model finding of severity warning reaches the report, the log line and the pod's termination message as a warning.

    An SFT maxLength beyond the context window is a warning (positions never trained), not a failure:
    the check is ``warning`` with the finding as its summary, the preflight still exits 0, and the
    run's status gets the warning line (``preflight passed with warnings: ...``), not "passed".
    """
    from retool.preflight import entry, runner
    from retool.preflight.checks import WARNINGS_PREFIX
    from retool.preflight.plan import PreflightOptions
    from retool.preflight.report import Report, summary_lines

    doc = yaml.safe_load((REPO / "examples" / "retoolrun-qwen7b-ascend.yaml").read_text())
    doc["spec"]["sft"] = {**doc["spec"].get("sft", {}), "enabled": True, "maxLength": 40000}
    run_spec = parse_run(doc).spec
    result = check_model(run_spec, model_dir(tmp_path, QWEN_7B), Tokenizer(151665))
    warning = "spec.sft.maxLength: 40000 tokens is longer than the model's context window of 32768"
    assert result.status == "warning", result
    assert result.summary.startswith(warning) and "fit the" not in result.summary
    assert result.details["findings"] == [{"severity": "warning", "path": "spec.sft.maxLength", "message": result.summary.split(": ", 1)[1]}]

    report = Report(run="r", namespace="ns", stages=("sft", "rl"), tokenizer="t", recipe="retool", sandbox_url=None, results=(result,), seconds=0.1)
    assert report.exit_code == 0 and report.passed and report.failure is None
    assert report.warnings == f"{WARNINGS_PREFIX}model: {result.summary}"
    assert f"| model | run | WARN | {warning}" in report.to_markdown()
    assert report.to_dict()["checks"][0]["status"] == "warning"
    assert summary_lines(report.results) == [f"WARN  model: {result.summary}"]

    # through the entry that delivers the verdict: the termination message the operator reads carries the warning
    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setattr(runner, "run_preflight", lambda target, options: report)
    monkeypatch.setattr(entry, "write_termination_message", lambda message: termination.write_text(message) is not None)
    target = SimpleNamespace(run=parse_run(doc))  # execute reads only the run's trainer line before handing over
    delivered = entry.execute(target, PreflightOptions(tokenizer="t", work_dir=tmp_path / "work"))  # type: ignore[arg-type]
    assert delivered.exit_code == 0
    assert termination.read_text() == f"{WARNINGS_PREFIX}model: {result.summary}"
    written = json.loads((tmp_path / "work" / "preflight-report.json").read_text())
    assert written["passed"] is True and written["checks"][0]["status"] == "warning"
