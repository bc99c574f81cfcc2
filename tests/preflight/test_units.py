"""The preflight's pure parts: verdicts and exit codes, the report, the stage's rendered command,
and the decisions inside the checks (lengths, samples, trained spans, reward result shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from retool import stage
from retool.data.schema import RL_SCHEMA, rl_row
from retool.preflight import command as preflight_command
from retool.preflight.checks import BY_NAME, CHECKS, EXIT_OK, CheckResult, exit_code, failure_message, first_failure
from retool.preflight.data import Prompt, agent_mismatch
from retool.preflight.episodes import expected_output, through_end_of_turn, tool_code, trained_spans
from retool.preflight.report import Report, write_report, write_termination_message
from retool.preflight.reward import shape_problems
from retool.preflight.sft import percentiles, sample_rows, span_problems
from retool.preflight.tracking import metrics_of
from retool.preflight.trainer import step_rows
from retool.recipe.render.stages import render_stage
from retool.runtime.context import StageContext
from retool.spec.validate import parse_run
from tests.conftest import EXAMPLES


def result(check: str, status: str = "failed", scope: str = "run", summary: str = "why") -> CheckResult:
    return CheckResult(check, scope, status, summary)  # type: ignore[arg-type]


def test_exit_codes_are_distinct_and_outside_what_a_process_uses_for_other_failures() -> None:
    codes = [c.exit_code for c in CHECKS]
    assert len(set(codes)) == len(codes) and min(codes) >= 10 and max(codes) < 126


def test_the_earliest_check_names_the_exit_status_whatever_the_order_results_came_in() -> None:
    results = [result("rollout", scope="eval"), result("tokenizer", "passed"), result("tools", scope="rl+eval", summary="no module x")]
    assert first_failure(results) is results[2]
    assert exit_code(results) == BY_NAME["tools"].exit_code
    assert failure_message(results) == "preflight check tools[rl+eval] failed: no module x (also failed: rollout[eval])"
    assert exit_code([result("tokenizer", "passed"), result("sft-data", "warning")]) == EXIT_OK


def test_a_result_must_name_a_known_check() -> None:
    with pytest.raises(ValueError, match="unknown check 'tokeniser'"):
        result("tokeniser")


def test_the_report_renders_the_verdict_every_check_and_the_details(tmp_path: Path) -> None:
    results = (
        result("tokenizer", "passed", summary="fine"),
        CheckResult("sft-data", "sft", "failed", "row 3 trains on | nothing", {"p50": 120, "problems": ["a"] * 10}),
        result("rollout", "skipped", "eval", "needs sft"),
    )
    report = Report(
        run="r",
        namespace="ns",
        stages=("sft", "eval"),
        tokenizer="/t",
        recipe="tool-integrated",
        sandbox_url="http://s",
        results=results,
        seconds=3.2,
        facts={"sft_tokens_p50": 120},
    )
    markdown = report.to_markdown()
    assert markdown.startswith("# Preflight of ns/r: FAILED (exit 12): preflight check sft-data[sft] failed: row 3 trains on | nothing")
    assert "| sft-data | sft | FAIL | row 3 trains on \\| nothing |" in markdown
    assert "| rollout | eval | skip | needs sft |" in markdown
    assert '- problems: ["a", "a", "a", "a", "a", "a", "a", "a", ... (10 in all)]' in markdown
    json_path, md_path = write_report(report, tmp_path / "out")
    payload = json.loads(json_path.read_text())
    assert payload["exit_code"] == 12 and payload["passed"] is False and payload["checks"][1]["details"]["p50"] == 120
    assert md_path.read_text() == markdown


def test_the_termination_message_is_written_only_where_kubernetes_created_the_file(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert write_termination_message("preflight check x failed", str(log)) is False and not log.exists()
    log.write_text("")
    assert write_termination_message("preflight check x failed: " + "y" * 5000, str(log)) is True
    assert log.read_text().startswith("preflight check x failed") and len(log.read_text()) == 4000


def test_report_figures_become_mlflow_metrics() -> None:
    facts = {"sft_tokens_p99": 900, "flag": True, "note": "x"}
    report = Report(run="r", namespace="n", stages=(), tokenizer="t", recipe="tool-integrated", sandbox_url="s", results=(result("tools"),), seconds=1.234, facts=facts)
    assert metrics_of(report) == {"preflight/sft_tokens_p99": 900.0, "preflight/seconds": 1.23, "preflight/failed_checks": 1.0, "preflight/exit_code": 15.0}


PERCENTILES = [
    ("none over", [10, 20, 30, 40], 50, {"rows": 4, "max": 40, "over_max_length": 0, "over_fraction": 0.0}),
    ("one over", [10, 20, 30, 400], 50, {"rows": 4, "max": 400, "over_max_length": 1, "over_fraction": 0.25}),
    ("equal is not over", [50, 50], 50, {"rows": 2, "max": 50, "over_max_length": 0, "over_fraction": 0.0}),
]


@pytest.mark.parametrize(("lengths", "max_length", "expected"), [c[1:] for c in PERCENTILES], ids=[c[0] for c in PERCENTILES])
def test_length_percentiles_against_max_length(lengths: list[int], max_length: int, expected: dict) -> None:
    stats = percentiles(lengths, max_length)
    assert {k: stats[k] for k in expected} == expected
    assert stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]


def test_sampled_rows_hold_the_longest_and_rows_spread_over_the_file() -> None:
    lengths = list(range(100))
    rows = sample_rows(lengths, 12)
    assert set(range(97, 100)) <= set(rows) and 0 in rows and 50 in rows and rows == sorted(set(rows))
    assert len(set(sample_rows(list(range(1000)), 200)) & set(range(984, 1000))) == 16, "at most 16 of the longest"
    assert sample_rows([5, 1], 10) == [0, 1]


SPANS = [
    ("clean answer", "So it is 45. \\boxed{90}", [], []),
    ("raw ReTool interpreter output", "<code>print(1)</code><interpreter>1</interpreter>", [], ["contains '<interpreter>'", "contains '</interpreter>'"]),
    ("a tool response block", "<tool_response>\n7\n</tool_response>", [], ["contains '<tool_response>'", "contains '</tool_response>'"]),
    ("a long tool output copied in", "I ran it: Traceback (most recent call last) ...", ["Traceback (most recent call last)"], ["contains the tool output"]),
    ("a short output is not searched", "the result is 42", ["42"], []),
]


@pytest.mark.parametrize(("text", "outputs", "expected"), [c[1:] for c in SPANS], ids=[c[0] for c in SPANS])
def test_trained_text_holding_interpreter_output(text: str, outputs: list[str], expected: list[str]) -> None:
    found = span_problems(text, outputs, assistant_texts=[text.replace(o, "") for o in outputs] or [text])
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected, strict=True))


def test_output_the_assistant_itself_quotes_is_not_interpreter_output() -> None:
    output = "Traceback (most recent call last)"
    assert span_problems(f"it said {output}", [output], assistant_texts=[f"it said {output}"]) == []


def test_trained_spans_are_the_runs_of_loss_tokens_cut_at_the_end_of_turn() -> None:
    ids = [1, 2, 3, 4, 9, 5, 6, 7, 8, 9, 10]
    mask = [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1]
    spans = trained_spans(ids, mask)
    assert spans == [[2, 3, 4, 9], [7, 8, 9, 10]]
    assert [through_end_of_turn(s, [9]) for s in spans] == [(2, 3, 4, 9), (7, 8, 9)]


def test_the_scripted_code_prints_a_line_that_its_source_does_not_contain() -> None:
    code = tool_code("\\frac{1}{2}")
    assert expected_output("\\frac{1}{2}") not in code
    namespace: dict = {}
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(code, namespace)
    assert out.getvalue().strip() == expected_output("\\frac{1}{2}")


SHAPES = [
    ("plain scores", [1.0, -1.0], [], [], []),
    ("retool's results", [{"score": 1.0, "acc": 1.0, "pred": "2", "source": "d"}, {"score": -1.0, "acc": 0.0, "pred": "", "source": "d"}], ["data_source"], [], []),
    ("a key repeating a column", [{"score": 1.0, "data_source": "d"}], ["data_source", "uid"], ["result key 'data_source' repeats the batch column 'data_source'"], []),
    ("a type that changes", [{"score": 1.0, "acc": True}, {"score": -1.0, "acc": 0.0}], [], ["result key 'acc' changes type across samples (bool, float)"], ["acc"]),
    ("keys that change", [{"score": 1.0}, {"score": -1.0, "why": "x"}], [], ["results have different keys across samples"], []),
]


@pytest.mark.parametrize(("results", "columns", "problems", "booleans"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_reward_result_shapes(results: list, columns: list[str], problems: list[str], booleans: list[str]) -> None:
    found, found_booleans = shape_problems(results, columns)
    assert len(found) == len(problems) and all(f.startswith(p) for f, p in zip(found, problems, strict=True))
    assert found_booleans == booleans


STEPS = [
    ("one source, n divisible by the workers", 1, 16, 8, 1),
    ("n shares no factor with the workers", 2, 3, 8, 8),
    ("three sources, n=4 on 8 workers", 3, 4, 8, 6),
]


@pytest.mark.parametrize(("sources", "n", "workers", "rows"), [c[1:] for c in STEPS], ids=[c[0] for c in STEPS])
def test_a_training_step_splits_evenly_between_agent_workers(sources: int, n: int, workers: int, rows: int) -> None:
    prompts = [Prompt(f"s{i}", i * 10, f"q{i}", "1") for i in range(sources)]
    chosen = step_rows(prompts, n, workers)
    assert len(chosen) == rows and (len(chosen) * n) % workers == 0
    assert set(chosen) == {p.index for p in prompts}


def example(name: str):
    return parse_run(yaml.safe_load(next(p for p in EXAMPLES if p.stem == f"retoolrun-{name}").read_text()))


def test_the_preflight_stage_command() -> None:
    run = example("qwen32b-h200")
    ctx = StageContext(run_name=run.metadata.name, namespace="retool", sandbox_url="http://sb:8080", attempt=2)
    command = render_stage(run, "preflight", ctx, spec_file="/etc/retool/run.yaml")
    report_dir = "/data/retool/qwen32b-h200/stages/preflight-2"
    tokenizer = "/data/retool/qwen32b-h200/models/base"  # the staged model
    launcher = ("python3", "-m", "retool.runtime.cpu_only", "-m", "retool.preflight")
    assert command.argv == (*launcher, "--spec", "/etc/retool/run.yaml", "--tokenizer", tokenizer, "--report-dir", report_dir)
    # A CPU pod reading the staged model: no accelerator backend, no device, no hub.
    assert command.env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" and command.env["CUDA_VISIBLE_DEVICES"] == "" and command.env["HF_HUB_OFFLINE"] == "1"
    assert command.env["HF_HOME"].startswith("/data/retool/qwen32b-h200/")
    assert command.config_name is None and not command.files
    assert command.stage == preflight_command.STAGE


def test_the_stage_entry_renders_the_preflight_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text(next(p for p in EXAMPLES if p.stem == "retoolrun-qwen7b-ascend").read_text())
    env = StageContext(run_name="qwen7b-ascend", namespace="retool", sandbox_url="http://sb:8080").to_env()
    assert stage.main(["preflight", "--spec", str(spec), "--dry-run"], env) == 0
    out = capsys.readouterr().out
    assert "python3 -m retool.runtime.cpu_only -m retool.preflight --spec" in out and "--tokenizer /data/retool/qwen7b-ascend/models/base" in out
    assert "export TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out


def test_the_cli_refuses_bad_arguments_before_loading_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from retool.cli import main

    spec = next(p for p in EXAMPLES if p.stem == "retoolrun-minimal")
    assert main(["preflight", str(spec), "--max-truncated-fraction", "2"]) == 2  # could not start (docs/cli.md)
    assert "--max-truncated-fraction must be within 0..1" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: RetoolRun\nmetadata: {name: Bad_Name}\nspec: {}\n")
    assert main(["preflight", str(broken)]) == 2
    assert "Bad_Name" in capsys.readouterr().err


def test_retool_preflight_names_the_extra_it_needs_where_verl_is_not_installed(tmp_path: Path) -> None:
    from tests.spec.test_cli_extras import run_without_extras

    spec = next(p for p in EXAMPLES if p.stem == "retoolrun-minimal")
    result = run_without_extras(tmp_path, "preflight", str(spec), "--tokenizer", str(tmp_path), "--sandbox-url", "http://127.0.0.1:9", "--report-dir", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert "retool preflight needs the 'train' extra" in result.stderr and "Traceback" not in result.stderr


class CharTokenizer:
    """One token per character: enough for the scripted server, which only decodes."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_the_scripted_server_replays_the_episode_of_the_longest_question_its_prompt_holds() -> None:
    import asyncio

    from retool.preflight.agent import Episode, ScriptedServer

    short = Episode("b?", "1", (tuple(encode("call-b")), tuple(encode("answer-b"))), "out-b")
    longer = Episode("ab?", "2", (tuple(encode("call-ab")), tuple(encode("answer-ab"))), "out-ab")
    server = ScriptedServer(CharTokenizer(), [short, longer], missing_output_turn=encode("no output"))

    def turn(request: str, prompt: str) -> str:
        return CharTokenizer.decode(asyncio.run(server.generate(request, prompt_ids=encode(prompt), sampling_params={})).token_ids)

    assert turn("r1", "user: ab?") == "call-ab"
    assert turn("r1", "user: ab?call-ab<tool>out-ab</tool>") == "answer-ab"
    assert turn("r2", "user: b?") == "call-b"
    assert turn("r2", "user: b?call-b<tool>Sandbox error</tool>") == "no output"
    assert server.transcripts["r1"].tool_output_seen is True and server.transcripts["r2"].tool_output_seen is False
    assert server.transcripts["r2"].tool_turn_texts == ["<tool>Sandbox error</tool>"]
    with pytest.raises(LookupError, match="no scripted episode"):
        turn("r3", "user: something else")


def rl_file(path: Path, agents: list[str | None], *, with_column: bool = True) -> str:
    rows = [rl_row(data_source="s", question=f"q{i}", ground_truth="1", index=i, split="train", source_id=None) | {"agent_name": a} for i, a in enumerate(agents)]
    table = pa.Table.from_pylist(rows, schema=RL_SCHEMA)
    pq.write_table(table if with_column else table.drop(["agent_name"]), path)
    return str(path)


TOOL, TEXT = "tool_agent", "single_turn_agent"


@pytest.mark.parametrize(
    ("recipe", "files", "found"),
    [
        ("text-only", [[TEXT, TEXT]], None),
        ("tool-integrated", [[TOOL, TOOL]], None),
        ("text-only", [[TOOL, TOOL, TOOL]], "'tool_agent' (3 of 3 rows)"),
        ("tool-integrated", [[TOOL, TOOL, TEXT]], "'single_turn_agent' (1 of 3 rows)"),
        ("tool-integrated", [[None, None]], None),
        ("text-only", [[None]], "'tool_agent' (1 of 1 rows)"),
        ("tool-integrated", [[TOOL], [TEXT, TEXT]], "'single_turn_agent' (2 of 2 rows)"),
    ],
    ids=[
        "text-only rows in a text-only run",
        "tool rows in a tool run",
        "tool rows in a text-only run",
        "a few text-only rows in a tool run",
        "rows naming no agent go to the tool agent, as the dataset class routes them",
        "rows naming no agent are wrong for a text-only run",
        "the second of two files prepared for the other recipe",
    ],
)
def test_prepared_rows_must_name_the_recipes_agent_loop(tmp_path: Path, recipe: str, files: list[list[str | None]], found: str | None) -> None:
    paths = [rl_file(tmp_path / f"{i}.parquet", agents) for i, agents in enumerate(files)]
    problem, agents = agent_mismatch(paths if len(paths) > 1 else paths[0], recipe)
    assert list(agents) == paths
    if found is None:
        assert problem is None
    else:
        expected = TOOL if recipe == "tool-integrated" else TEXT
        assert problem == (
            f"{paths[-1]} was prepared for another recipe: its rows name the agent loop {found}, but recipe {recipe} runs {expected!r} "
            "(prepare the data again for this run: retool data prepare all --spec RUN.yaml)"
        )


def test_a_file_without_agent_names_goes_to_the_tool_agent_and_an_unreadable_one_is_left_to_loading(tmp_path: Path) -> None:
    path = rl_file(tmp_path / "old.parquet", [TOOL, TOOL], with_column=False)
    assert agent_mismatch(path, "tool-integrated") == (None, {path: {TOOL: 2}})
    assert "its rows name the agent loop 'tool_agent' (2 of 2 rows)" in (agent_mismatch(path, "text-only")[0] or "")
    assert agent_mismatch(str(tmp_path / "missing.parquet"), "text-only") == (None, {})


def test_a_passing_preflight_with_warnings_has_one_line_for_the_runs_status() -> None:
    from retool.preflight.checks import WARNINGS_PREFIX, warnings_message

    results = [result("tokenizer", "passed"), result("eval-data", "warning", "eval", "the eval would score 3 of 6 problems"), result("model", "warning", summary="sft long")]
    assert warnings_message(results) == f"{WARNINGS_PREFIX}eval-data[eval]: the eval would score 3 of 6 problems | model: sft long"
    assert warnings_message([result("tokenizer", "passed")]) is None
    assert exit_code(results) == EXIT_OK
