"""``retool compare`` on two RetoolRuns recorded through the production logging paths in a real MLflow server,
and the experiment as MLflow's UI reads it (its kind, the parent run's description).

What each run holds is written the way production writes it: the RL validation rounds through verl
0.6.1's own MLflow logger (``_MlflowLoggingAdapter``, its ``@`` -> ``_at_`` keys) with metrics named
by verl's rule (:func:`retool.recipe.metrics.validation_metrics` without pass@k: verl logs none while
training), the dynamics through the trainer's watcher target, the eval stage through
``log_eval_results`` (``eval/results.json``, what status.results holds).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from retool.cli import main
from retool.recipe.metrics import validation_metrics
from retool.recipe.verl_plugins.watch import MlflowTarget
from retool.tracking import ensure_parent_run, start_stage_run
from retool.tracking.compare import RunSeries, curve_keys, figure, format_table, load_run_series, merge_attempts, resolve_parent, score_table, smooth
from retool.tracking.evaluation import log_eval_results
from tests.tracking.conftest import MLflowServer

N = 4
PROBLEMS = 10
MEAN, MAJ, BEST = "val-core/aime_2024/acc/mean_at_4", "val-core/aime_2024/acc/maj_at_4/mean", "val-core/aime_2024/acc/best_at_4/mean"
# The paper's curves in miniature (RL validation accuracy per step): ReTool passes the text-only best (0.4) at step 200.
TOOL_VAL = {0: 0.1, 100: 0.3, 200: 0.5, 300: 0.6, 400: 0.7}
TOOL_FIRST_ATTEMPT_AT_200 = 0.9  # the first attempt's step 200, logged again by the second attempt: the second's 0.5 wins
TEXT_VAL = {0: 0.1, 200: 0.2, 600: 0.3, 1000: 0.4, 1080: 0.3}
DYNAMICS = {"tool/code_ratio": {1: 0.4, 200: 0.8, 400: 0.98}, "tool/first_call_position_mean": {1: 0.6, 400: 0.2}}


def sample_rows(accuracy: float, n: int = N, source: str = "aime_2024") -> list[dict]:
    """Per-sample results of one round: ``accuracy`` of PROBLEMS x n samples correct (the first ones)."""
    correct = round(accuracy * PROBLEMS * n)
    return [
        {"data_source": source, "uid": f"p{p}", "score": 1.0 if p * n + i < correct else -1.0, "acc": p * n + i < correct, "pred": "7" if p * n + i < correct else str(i)}
        for p in range(PROBLEMS)
        for i in range(n)
    ]


def verl_validation(accuracy: float) -> dict[str, float]:
    """A validation round's metrics under verl's names (``val-core/aime_2024/acc/mean@4`` ...)."""
    rows = sample_rows(accuracy)
    infos = {"acc": [r["acc"] for r in rows], "pred": [r["pred"] for r in rows]}
    return validation_metrics([r["data_source"] for r in rows], [r["uid"] for r in rows], infos, with_pass_at_k=False)


def log_validation_like_verl(server: MLflowServer, run_id: str, rounds: dict[int, float]) -> None:
    from verl.utils.tracking import _MlflowLoggingAdapter

    mlflow.set_tracking_uri(server.uri)
    with mlflow.start_run(run_id=run_id):
        adapter = _MlflowLoggingAdapter()
        for step, accuracy in rounds.items():
            adapter.log(verl_validation(accuracy), step)


def record(server: MLflowServer, name: str, recipe: str, experiment: str, rl: list[tuple[dict[int, float], dict]], evals: list[float]) -> str:
    parent = ensure_parent_run(server.uri, experiment=experiment, namespace="team", name=name, uid=str(uuid.uuid4()), spec_params={"recipe": recipe})
    for attempt, (rounds, dynamics) in enumerate(rl, start=1):
        run_id = start_stage_run(server.uri, parent.run_id, "rl", attempt)
        log_validation_like_verl(server, run_id, rounds)
        for key, series in dynamics.items():
            for step, value in series.items():
                MlflowTarget(server.uri, run_id).log_metrics({key: value}, step)
    for attempt, accuracy in enumerate(evals, start=1):
        log_eval_results(server.uri, start_stage_run(server.uri, parent.run_id, "eval", attempt), sample_rows(accuracy, n=8))
    return parent.run_id


@pytest.fixture(scope="module")
def recorded(mlflow_server: MLflowServer) -> tuple[str, str]:
    experiment = f"retool/compare-{uuid.uuid4().hex[:6]}"
    first = ({**{s: v for s, v in TOOL_VAL.items() if s < 200}, 200: TOOL_FIRST_ATTEMPT_AT_200}, {k: {s: v for s, v in d.items() if s <= 200} for k, d in DYNAMICS.items()})
    second = ({s: v for s, v in TOOL_VAL.items() if s >= 200}, {k: {s: v for s, v in d.items() if s >= 200} for k, d in DYNAMICS.items()})
    # The tool run's eval ran twice (the first attempt logged 0.5, the retry 0.675): the retry's scores are final.
    tool = record(mlflow_server, "qwen32b-h200", "tool-integrated", experiment, [first, second], evals=[0.5, 0.675])
    text = record(mlflow_server, "qwen32b-h200-text-only", "text-only", experiment, [(TEXT_VAL, {})], evals=[0.4])
    return tool, text


def test_the_latest_attempts_win_the_curves_and_the_final_scores(recorded: tuple[str, str], mlflow_server: MLflowServer) -> None:
    run = load_run_series(mlflow_server.uri, resolve_parent(mlflow_server.uri, recorded[0]))
    assert run.metrics[MEAN] == pytest.approx(TOOL_VAL), "step 200 is the second attempt's 0.5, not the first's 0.9"
    assert run.metrics["tool/code_ratio"] == DYNAMICS["tool/code_ratio"]
    assert run.eval_attempt == 2 and run.eval_results["aime_2024"]["mean@8"] == pytest.approx(0.675)
    assert set(run.eval_results["aime_2024"]) == {"mean@8", "maj@8", "best@8", "pass@8"}
    assert set(curve_keys([run])) == {MEAN, MAJ, BEST}, "verl's val-core curves only: no std, no val-aux, no pass@k"


def test_a_run_recorded_under_the_old_two_slash_names_still_shows_its_dynamics(mlflow_server: MLflowServer) -> None:
    """Runs logged before the one-``/`` rule carry ``tool/first_call_position/mean``; compare reads it as today's name."""
    experiment = f"retool/compare-old-{uuid.uuid4().hex[:6]}"
    old = record(mlflow_server, "older", "tool-integrated", experiment, [({0: 0.1}, {"tool/first_call_position/mean": {1: 0.6, 2: 0.5}})], evals=[])
    run = load_run_series(mlflow_server.uri, resolve_parent(mlflow_server.uri, old))
    assert run.metrics["tool/first_call_position_mean"] == {1: 0.6, 2: 0.5}
    assert "tool/first_call_position/mean" not in run.metrics


def test_compare_prints_eval_scores_beside_the_validation_curves_and_logs_the_report(
    recorded: tuple[str, str], mlflow_server: MLflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tool run is given first: the baseline is the text-only run (its best 0.4: the tool run reaches it at step 200),
    not the first run given (whose best 0.7 the text-only run never reaches)."""
    tool, text = recorded
    assert main(["compare", "team/qwen32b-h200", text, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path), "--smooth", "0.5"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["aime_2024", "mean@8", "qwen32b-h200", "tool-integrated", "0.675", "-", "-", "-"] in lines
    assert ["aime_2024", "mean@8", "qwen32b-h200-text-only", "text-only", "0.400", "-", "-", "-"] in lines
    assert ["aime_2024", "mean@4", "qwen32b-h200", "tool-integrated", "-", "0.700@400", "0.700@400", "step", "200"] in lines
    assert ["aime_2024", "mean@4", "qwen32b-h200-text-only", "text-only", "-", "0.300@1080", "0.400@1000", "step", "1000"] in lines
    table = json.loads((tmp_path / "table.json").read_text())
    assert {r["baseline"] for r in table} == {"qwen32b-h200-text-only"}
    assert {(r["stat"], r["run"]) for r in table if r["eval"] is not None} == {
        (stat, run) for stat in ("mean@8", "maj@8", "best@8", "pass@8") for run in ("qwen32b-h200", "qwen32b-h200-text-only")
    }
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
    page = (tmp_path / "report.html").read_text()
    assert "<script src=" not in page and "Plotly.newPlot" in page, "the page is self-contained: plotly.js inlined"
    client = MlflowClient(mlflow_server.uri)
    for parent in (tool, text):
        logged = {a.path for a in client.list_artifacts(parent, "compare/qwen32b-h200-vs-qwen32b-h200-text-only")}
        assert logged == {f"compare/qwen32b-h200-vs-qwen32b-h200-text-only/{f}" for f in ("report.png", "report.html", "table.json")}


@pytest.mark.parametrize("order", ["text first", "tool first"])
def test_each_run_keeps_one_colour_in_every_panel_and_every_axis_is_labelled(recorded: tuple[str, str], mlflow_server: MLflowServer, order: str) -> None:
    runs = [load_run_series(mlflow_server.uri, resolve_parent(mlflow_server.uri, ref)) for ref in recorded]
    runs = runs[::-1] if order == "text first" else runs
    fig = figure(runs, curve_keys(runs), smoothing=0.6)
    colour_of: dict[str, set[str]] = {}
    for trace in fig.data:
        colour_of.setdefault(trace.legendgroup, set()).add(trace.line.color)
    assert {group: len(c) for group, c in colour_of.items()} == {"qwen32b-h200": 1, "qwen32b-h200-text-only": 1}
    assert len(set.union(*colour_of.values())) == 2, "two runs, two colours"
    assert sum(1 for t in fig.data if t.showlegend) == 2, "one legend entry per run, toggling it in every panel"
    panels = 3 + 2  # mean/maj/best@4, and the two dynamics only the tool run logged
    xaxes = [fig.layout[f"xaxis{i if i > 1 else ''}"] for i in range(1, panels + 1)]
    yaxes = [fig.layout[f"yaxis{i if i > 1 else ''}"] for i in range(1, panels + 1)]
    assert [a.title.text for a in xaxes] == ["training step"] * panels
    assert [a.title.text for a in yaxes] == ["mean@4 accuracy", "maj@4 accuracy", "best@4 accuracy", "share of responses with code", "first call position (0-1)"]


def test_parent_runs_carry_the_headline_so_mlflows_compare_view_works_on_them(recorded: tuple[str, str], mlflow_server: MLflowServer) -> None:
    from retool.tracking.headline import log_headline

    tool, text = recorded
    scores = load_run_series(mlflow_server.uri, resolve_parent(mlflow_server.uri, tool)).eval_results["aime_2024"]
    assert log_headline(mlflow_server.uri, tool) == pytest.approx(
        {
            **{f"final/aime_2024_{stat.replace('@', '_at_')}": value for stat, value in scores.items()},
            "best_validation/aime_2024_mean_at_4": 0.7,
            "best_validation/aime_2024_mean_at_4_step": 400.0,
            "progress/rl_steps_done": 400.0,
        }
    )
    log_headline(mlflow_server.uri, text)
    client = MlflowClient(mlflow_server.uri)
    assert client.get_run(tool).data.metrics["final/aime_2024_mean_at_8"] == pytest.approx(0.675)
    assert client.get_run(text).data.metrics["best_validation/aime_2024_mean_at_4_step"] == 1000.0
    experiment = client.get_run(tool).info.experiment_id
    parents = client.search_runs([experiment], filter_string="tags.`retool.role` = 'pipeline' and metrics.`final/aime_2024_mean_at_8` > 0.5")
    assert [r.info.run_id for r in parents] == [tool], "MLflow filters and compares parents by their headline"


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
    assert main(["compare", tool, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path), "--no-log", "--smooth", "1"]) == 2
    assert "--smooth must be within [0, 1), got 1.0" in capsys.readouterr().err


def test_experiments_open_as_model_training_and_parent_runs_say_what_their_plots_mean(recorded: tuple[str, str], mlflow_server: MLflowServer) -> None:
    client = MlflowClient(mlflow_server.uri)
    parent = client.get_run(recorded[0])
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == "finetuning"
    description = parent.data.tags["mlflow.note.content"]
    assert all(group in description for group in ("`val-core/`", "`tool/`", "`val-tool/`", "`reward-watch/`", "retool compare", "`final/`", "`best_validation/`"))


def test_attempts_merge_with_the_later_attempt_winning() -> None:
    assert merge_attempts([{1: 0.1, 2: 0.2}, {2: 0.25, 3: 0.3}]) == {1: 0.1, 2: 0.25, 3: 0.3}


@pytest.mark.parametrize(
    ("series", "weight", "expected"),
    [({1: 0.2, 5: 0.8}, 0.0, {1: 0.2, 5: 0.8}), ({1: 0.5, 2: 0.5, 9: 0.5}, 0.9, {1: 0.5, 2: 0.5, 9: 0.5}), ({1: 0.0, 2: 1.0}, 0.5, {1: 0.0, 2: 0.5 / 0.75})],
    ids=["no smoothing", "a constant stays constant (debiased)", "two points by hand"],
)
def test_smoothing_is_a_debiased_moving_average(series: dict, weight: float, expected: dict) -> None:
    assert smooth(series, weight) == pytest.approx(expected)


def test_without_a_text_only_run_the_first_run_is_the_baseline_and_a_run_that_never_gets_there_says_so() -> None:
    a = RunSeries("a", "1" * 32, "tool-integrated", {MEAN: {0: 0.2, 10: 0.5}})
    b = RunSeries("b", "2" * 32, "tool-integrated", {MEAN: {0: 0.1, 10: 0.3}})
    rows = score_table([a, b], curve_keys([a, b]))
    assert [(r["run"], r["baseline"], r["step_reaching_baseline_best"]) for r in rows] == [("a", "a", 10), ("b", "a", None)]
    assert "never" in format_table(rows)


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 1, 0)], ids=["text-only first", "text-only second", "text-only last"])
def test_the_text_only_run_is_the_baseline_wherever_it_is_given(order: tuple[int, int, int]) -> None:
    """docs/recipe.md: "the baseline's best validation value - the text-only run's when one is compared, else the first run's"."""
    runs = [
        RunSeries("text", "1" * 32, "text-only", {MEAN: {0: 0.1, 10: 0.4}}),
        RunSeries("tool", "2" * 32, "tool-integrated", {MEAN: {0: 0.2, 5: 0.4, 10: 0.7}}),
        RunSeries("other", "3" * 32, "tool-integrated", {MEAN: {0: 0.3, 10: 0.5}}),
    ]
    given = [runs[i] for i in order]
    rows = {r["run"]: (r["baseline"], r["step_reaching_baseline_best"]) for r in score_table(given, curve_keys(given))}
    assert rows == {"text": ("text", 10), "tool": ("text", 5), "other": ("text", 10)}


PLATEAU_VAL = {0: 0.1, 100: 0.5, 200: 0.3, 300: 0.5, 400: 0.4}
"""A run whose best (0.5) comes twice, at steps 100 and 300: the best is the first step reaching it, 100."""


def test_a_best_validation_value_reached_twice_is_reported_at_the_first_step_reaching_it(mlflow_server: MLflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's ``value@step`` (docs/recipe.md: "its last and best validation value as value@step") and the parent's
    headline (``best_validation/..._step``: "the step it was reached at") name step 100, where the run got there."""
    from retool.tracking.headline import log_headline

    plateau = record(mlflow_server, "plateau", "tool-integrated", f"retool/compare-plateau-{uuid.uuid4().hex[:6]}", [(PLATEAU_VAL, {})], evals=[])
    assert main(["compare", plateau, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path), "--no-log"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["aime_2024", "mean@4", "plateau", "tool-integrated", "-", "0.400@400", "0.500@100", "step", "100"] in lines, lines
    (row,) = [r for r in json.loads((tmp_path / "table.json").read_text()) if r["stat"] == "mean@4"]
    assert (row["validation_best"], row["validation_best_step"]) == (pytest.approx(0.5), 100)
    headline = log_headline(mlflow_server.uri, plateau)
    assert (headline["best_validation/aime_2024_mean_at_4"], headline["best_validation/aime_2024_mean_at_4_step"]) == (pytest.approx(0.5), 100.0)


def test_the_reward_watch_tag_of_the_running_rl_attempt_is_what_the_operator_reads(mlflow_server: MLflowServer) -> None:
    from retool.tracking import reward_suspect

    parent = ensure_parent_run(mlflow_server.uri, experiment="retool/watch", namespace="team", name="watched", uid=str(uuid.uuid4()), spec_params={})
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) is None, "no rl run yet"
    rl = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1)
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) is None, "no verdict yet"
    MlflowTarget(mlflow_server.uri, rl).set_tag("retool.rewardSuspect", "disagreed for 3 steps")
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) == "disagreed for 3 steps"
    MlflowTarget(mlflow_server.uri, rl).set_tag("retool.rewardSuspect", "")
    assert reward_suspect(mlflow_server.uri, parent.run_id, 1) == ""


def test_compare_shows_what_each_run_cost_from_the_operators_figures(mlflow_server: MLflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The operator logs ``status.cost`` on the parent run each time a stage attempt ends (``log_run_cost``); compare prints
    the last values beside the scores, and a run without any (an older run, a CPU run) gets no row."""
    from retool.tracking import log_run_cost

    experiment = f"retool/compare-cost-{uuid.uuid4().hex[:6]}"
    priced = record(mlflow_server, "priced", "tool-integrated", experiment, [(PLATEAU_VAL, {})], evals=[])
    unpriced = record(mlflow_server, "older", "tool-integrated", experiment, [(PLATEAU_VAL, {})], evals=[])
    log_run_cost(mlflow_server.uri, priced, {"cost/device_hours": 10.0, "cost/lost_device_hours": 2.0})
    log_run_cost(mlflow_server.uri, priced, {"cost/device_hours": 31.5, "cost/lost_device_hours": 4.25, "cost/device_hours_per_point": 0.63, "cost/amount": 78.75})
    assert main(["compare", priced, unpriced, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path), "--no-log"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    header = lines.index(["run", "device-hours", "lost", "on", "failed", "attempts", "device-hours", "per", "eval", "point", "amount"])
    rows = lines[header + 1 : lines.index([], header)]
    assert rows == [["priced", "31.5", "4.25", "0.63", "78.75"]], lines  # the last values; no row for the run without a cost
    page = next(tmp_path.glob("*.html")).read_text()
    assert "id='cost'" in page and "<td>31.5</td>" in page
