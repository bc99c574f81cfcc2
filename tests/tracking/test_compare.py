"""``retool compare`` on two recorded RetoolRuns (a ReTool run and its text-only baseline) in a real MLflow server,
and the experiment as MLflow's UI reads it (its kind, the parent run's description)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from retool.cli import main
from retool.tracking import ensure_parent_run, start_stage_run
from retool.tracking.compare import RunSeries, format_table, merge_attempts, score_keys, score_table
from tests.tracking.conftest import MLflowServer

MEAN, PASS = "val-core/aime_2024/acc/mean_at_30", "val-core/aime_2024/acc/pass_at_30"

# The paper's curves in miniature: ReTool reaches the text-only best (0.40) at step 200 and 0.67 at 400.
TOOL = {MEAN: {0: 0.1, 100: 0.3, 200: 0.42, 300: 0.55, 400: 0.67}, PASS: {0: 0.3, 200: 0.7, 400: 0.85}}
TEXT = {MEAN: {0: 0.1, 200: 0.2, 600: 0.32, 1000: 0.40, 1080: 0.39}, PASS: {0: 0.3, 600: 0.6, 1080: 0.7}}
DYNAMICS = {"tool/code_ratio": {1: 0.4, 200: 0.8, 400: 0.98}, "tool/first_call_position/mean": {1: 0.6, 400: 0.2}}


def record(server: MLflowServer, name: str, recipe: str, experiment: str, attempts: list[dict[str, dict[int, float]]]) -> str:
    parent = ensure_parent_run(server.uri, experiment=experiment, namespace="team", name=name, uid=str(uuid.uuid4()), spec_params={"recipe": recipe})
    client = MlflowClient(server.uri)
    for attempt, metrics in enumerate(attempts, start=1):
        run_id = start_stage_run(server.uri, parent.run_id, "rl", attempt)
        client.log_batch(run_id, metrics=[Metric(key, value, 0, step) for key, series in metrics.items() for step, value in series.items()])
    return parent.run_id


@pytest.fixture(scope="module")
def recorded(mlflow_server: MLflowServer) -> tuple[str, str]:
    experiment = f"retool/compare-{uuid.uuid4().hex[:6]}"
    first = {k: {s: v for s, v in series.items() if s <= 200} for k, series in {**TOOL, **DYNAMICS}.items()}
    # The second attempt resumed from step 200 and logged step 200 again (a different value wins).
    second = {k: {s: v for s, v in series.items() if s >= 200} for k, series in {**TOOL, **DYNAMICS}.items()}
    tool = record(mlflow_server, "qwen32b-h200", "tool-integrated", experiment, [first, second])
    text = record(mlflow_server, "qwen32b-h200-text-only", "text-only", experiment, [TEXT])
    return tool, text


def test_compare_prints_the_table_writes_the_report_and_logs_it_to_both_parent_runs(
    recorded: tuple[str, str], mlflow_server: MLflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool, text = recorded
    assert main(["compare", "team/qwen32b-h200", text, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    assert ["aime_2024/acc/mean_at_30", "qwen32b-h200", "tool-integrated", "0.670", "400", "0.670", "step", "200"] in lines
    assert ["aime_2024/acc/mean_at_30", "qwen32b-h200-text-only", "text-only", "0.390", "1080", "0.400", "step", "1000"] in lines
    table = json.loads((tmp_path / "table.json").read_text())
    assert {(r["metric"], r["run"], r["step_reaching_baseline_best"]) for r in table} == {
        (MEAN, "qwen32b-h200", 200),
        (MEAN, "qwen32b-h200-text-only", 1000),
        (PASS, "qwen32b-h200", 200),
        (PASS, "qwen32b-h200-text-only", 1080),
    }
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "src='http" not in page, "the page is self-contained"
    client = MlflowClient(mlflow_server.uri)
    for parent in (tool, text):
        logged = {a.path for a in client.list_artifacts(parent, "compare/qwen32b-h200-vs-qwen32b-h200-text-only")}
        assert logged == {f"compare/qwen32b-h200-vs-qwen32b-h200-text-only/{f}" for f in ("report.png", "report.html", "table.json")}


def test_a_stage_run_id_names_its_parent_and_an_unknown_name_is_a_clear_error(
    recorded: tuple[str, str], mlflow_server: MLflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool, _ = recorded
    stage = MlflowClient(mlflow_server.uri).search_runs([MlflowClient(mlflow_server.uri).get_run(tool).info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{tool}'")[
        0
    ]
    assert main(["compare", stage.info.run_id, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path), "--no-log"]) == 0
    assert "qwen32b-h200" in capsys.readouterr().out
    assert main(["compare", "no-such-run", "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path)]) == 1
    assert "no RetoolRun named 'no-such-run'" in capsys.readouterr().err
    assert main(["compare", tool, tool, "--tracking-uri", mlflow_server.uri]) == 2


def test_experiments_open_as_model_training_and_parent_runs_say_what_their_plots_mean(recorded: tuple[str, str], mlflow_server: MLflowServer) -> None:
    client = MlflowClient(mlflow_server.uri)
    parent = client.get_run(recorded[0])
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == "finetuning"
    description = parent.data.tags["mlflow.note.content"]
    assert all(group in description for group in ("`val-core/`", "`tool/`", "`val-tool/`", "`reward-watch/`", "retool compare"))


def test_attempts_merge_with_the_later_attempt_winning() -> None:
    assert merge_attempts([{1: 0.1, 2: 0.2}, {2: 0.25, 3: 0.3}]) == {1: 0.1, 2: 0.25, 3: 0.3}


def test_without_a_text_only_run_the_first_run_is_the_baseline_and_a_run_that_never_gets_there_says_so() -> None:
    a = RunSeries("a", "1" * 32, "tool-integrated", {MEAN: {0: 0.2, 10: 0.5}})
    b = RunSeries("b", "2" * 32, "tool-integrated", {MEAN: {0: 0.1, 10: 0.3}})
    rows = score_table([a, b], score_keys([a, b]))
    assert [(r["run"], r["baseline"], r["step_reaching_baseline_best"]) for r in rows] == [("a", "a", 10), ("b", "a", None)]
    assert "never" in format_table(rows)


def test_the_reward_watch_tag_of_the_running_rl_attempt_is_what_the_operator_reads(mlflow_server: MLflowServer) -> None:
    from retool.recipe.verl_plugins.watch import MlflowTarget
    from retool.tracking import reward_suspect

    parent = ensure_parent_run(mlflow_server.uri, experiment="retool/watch", namespace="team", name="watched", uid=str(uuid.uuid4()), spec_params={})
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) is None, "no rl run yet"
    rl = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1)
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) is None, "no verdict yet"
    MlflowTarget(mlflow_server.uri, rl).set_tag("retool.rewardSuspect", "disagreed for 3 steps")
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) == "disagreed for 3 steps"
    MlflowTarget(mlflow_server.uri, rl).set_tag("retool.rewardSuspect", "")
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) == ""
