"""``retool eval`` end to end: a scripted OpenAI-compatible endpoint, the real sandbox, the real reward.

The endpoint answers with tool calls; their code runs in our sandbox; the outputs must come back
as ``tool`` messages (the endpoint records them) and the final answers quote them, so a sample is
only scored correct when the whole round trip worked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from retool.evaluate.app import EvalConfig, run_eval
from retool.evaluate.results import read_results
from retool.tracking.evaluation import load_eval_results
from tests.conftest import free_port, repo_env
from tests.evaluate.scripted_endpoint import Call, Say, ScriptedEndpoint, ServerThread, build_app, demo_scripts
from tests.tracking.metric_sections import chart_section

pytestmark = pytest.mark.slow

MODEL = "scripted-retool"
PROBLEMS = [
    {"problem": "[power] What is 2^10 + 7?", "answer": "1031"},
    {"problem": "[comb] How many 3-element subsets does a 10-element set have?", "answer": "120"},
    {"problem": "[fix] What is 1 + 2 + ... + 100?", "answer": "5050"},
    {"problem": "[guess] What is 3 + 5?", "answer": "8"},
    {"problem": "[loop] Count the primes below 100.", "answer": "25"},
    {"problem": "[badargs] What is 6 * 7?", "answer": "42"},
    {"problem": "[pair] What is 3 * 37?", "answer": "111"},
]


def scripts() -> dict[str, list[Call | Say]]:
    return {
        "[power]": [Call("print(2**10 + 7)"), Say("The interpreter printed {last}, so the answer is \\boxed{{last}}.")],
        # A trailing bare expression: the tool must print its value, as in training.
        "[comb]": [Call("import math\nmath.comb(10, 3)"), Say("So \\boxed{{last}}.")],
        # A failing call first: the model must see the real traceback, then it fixes the code.
        "[fix]": [Call("print(total)"), Call("print(sum(range(1, 101)))"), Say("\\boxed{{last}}")],
        # No tool at all, and a wrong answer.
        "[guess]": [Say("I think it is \\boxed{7}.")],
        # Never stops calling the tool: the turn budget ends the conversation.
        "[loop]": [Call("print(len([p for p in range(2, 100) if all(p % d for d in range(2, p))]))")],
        # Arguments that are not JSON: the model is told so, then answers.
        "[badargs]": [Call(raw_arguments='{"code": "print(6*7)"'), Say("The answer is \\boxed{42}.")],
        # Two calls in one turn: as in RL (max_parallel_calls=1) only the first runs; the second is dropped.
        "[pair]": [Call("print(3 * 37)", also=("print(-1)",)), Say("\\boxed{{last}}")],
    }


@pytest.fixture
def endpoint():
    scripted = ScriptedEndpoint(model=MODEL, scripts=scripts(), fail_first={"[power]"})
    with ServerThread(build_app(scripted)) as server:
        yield scripted, server.url


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "aime_demo.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return path


async def test_eval_round_trips_through_the_real_sandbox(endpoint, data, sandbox, tmp_path):
    scripted, url = endpoint
    out = tmp_path / "results.jsonl"
    config = EvalConfig(
        endpoint=url, model=MODEL, data=data, n=2, max_turns=3, concurrency=3, temperature=0.6, top_p=0.95, seed=7, sandbox_url=sandbox.base_url, out=out
    )
    outcome = await run_eval(config)

    assert scripted.problems == []
    # Sampling parameters reach the server; sample k of a problem uses seed + k.
    assert scripted.sampling == {(0.6, 0.95, 7), (0.6, 0.95, 8)}
    # Real sandbox output came back to the model as tool messages.
    assert "1031" in scripted.tool_outputs("[power]")[0]
    assert scripted.tool_outputs("[comb]")[0].strip() == "120"
    fix = scripted.tool_outputs("[fix]")
    assert "NameError" in fix[0] and "total" in fix[0]
    assert fix[-1].strip() == "5050"
    assert "JSON" in scripted.tool_outputs("[badargs]")[0]

    results = read_results(out)
    assert len(results) == len(PROBLEMS) * 2
    by_problem = {PROBLEMS[r.problem_index]["problem"].split("]")[0] + "]": r for r in results}
    expected = {
        "[power]": (True, "1031", 2, 1, "answered"),
        "[comb]": (True, "120", 2, 1, "answered"),
        "[fix]": (True, "5050", 3, 2, "answered"),
        "[guess]": (False, "7", 1, 0, "answered"),
        "[loop]": (False, None, 3, 2, "max_turns"),
        "[badargs]": (True, "42", 2, 1, "answered"),
        "[pair]": (True, "111", 2, 1, "answered"),
    }
    for marker, (acc, pred, turns, calls, stop) in expected.items():
        r = by_problem[marker]
        assert (r.acc, r.pred or None, r.turns, r.tool_calls, r.stop) == (acc, pred, turns, calls, stop), marker
    assert by_problem["[fix]"].tool_failures == 1
    assert by_problem["[badargs]"].tool_failures == 1
    assert by_problem["[power]"].messages[-1]["content"].endswith("\\boxed{1031}.")

    # The turn that spends the budget does not run its call (verl's tool agent loop).
    assert len(scripted.tool_outputs("[loop]")) == 2 * 2
    assert [len(m.get("tool_calls") or []) for m in by_problem["[pair]"].messages if m["role"] == "assistant"] == [1, 0]

    summary = outcome.summary
    assert summary["val-core/aime/acc/mean@2"] == pytest.approx(5 / 7)
    assert summary["val-core/aime/acc/pass@2"] == pytest.approx(5 / 7)
    assert summary["eval/tool_calls_total"] == 2 * (1 + 1 + 2 + 0 + 2 + 1 + 1)
    assert summary["eval/stop_max_turns"] == pytest.approx(1 / 7)
    assert summary["eval/errors"] == 0
    assert json.loads(outcome.summary_path.read_text()) == pytest.approx(summary)


def test_eval_cli_with_embedded_sandbox_and_mlflow(endpoint, data, tmp_path):
    """The command a user runs: no --sandbox-url, so it starts (and stops) its own sandbox. MLflow is
    a sqlite store here (the demo's test logs through a real MLflow server)."""
    _, url = endpoint
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "cli.jsonl"
    command = [
        sys.executable, "-m", "retool.cli", "eval",
        "--endpoint", url, "--model", MODEL, "--data", str(data), "-n", "1", "--max-turns", "3",
        "--out", str(out), "--mlflow-uri", tracking_uri, "--experiment", "eval-e2e", "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    # cwd: a sqlite store keeps artifacts in ./mlruns, MLflow's default.
    done = subprocess.run(command, env=repo_env(), capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["val-core/aime/acc/mean@1"] == pytest.approx(5 / 7)
    assert len(out.read_text().splitlines()) == len(PROBLEMS)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("eval-e2e")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["val-core/aime/acc/mean_at_1"] == pytest.approx(5 / 7)
    ours = [k for k in run.data.metrics if not k.startswith(("val-core/", "val-aux/"))]  # verl's names are verl's
    assert "eval/tool_calls_mean" in ours and {chart_section(k) for k in ours} == {"eval"}, sorted(ours)
    assert run.data.params["model"] == MODEL
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"cli.jsonl", "cli.summary.json", "eval"}
    # The eval stage's layout too: what the operator reads into status.results.
    assert load_eval_results(tracking_uri, run.info.run_id)["aime"]["mean@1"] == pytest.approx(5 / 7)
    # The embedded sandbox the command started is gone with it.
    (pid,) = re.findall(r"sandbox ready at \S+ \(pid (\d+)\)", done.stderr)
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "missing.jsonl"], "missing.jsonl: no such file"),
        (["-n", "0"], "-n must be at least 1"),
    ],
    ids=["missing data file", "zero samples"],
)
def test_eval_cli_rejects_bad_input_before_starting_anything(args, message, tmp_path):
    command = [sys.executable, "-m", "retool.cli", "eval", "--endpoint", "http://127.0.0.1:9", "--model", MODEL, "--data", "x.jsonl", *args]
    done = subprocess.run(command, env=repo_env(), capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize(
    ("where", "failed"),
    [("scripted", 1), ("nothing listens", 2)],
    ids=["an endpoint that refuses one sample's request exits 1", "an endpoint where nothing listens exits 1"],
)
def test_eval_cli_exits_1_when_samples_fail_at_the_endpoint(where, failed, endpoint, sandbox, tmp_path):
    """docs/recipe.md: a sample whose requests keep failing is recorded with its ``error`` and the
    command exits 1 (a mistyped URL must not look like a model that scored 0)."""
    _, url = endpoint
    if where == "nothing listens":
        url = f"http://127.0.0.1:{free_port()}"
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in (PROBLEMS[1], {"problem": "[unscripted] 1 + 1?", "answer": "2"})))
    out = tmp_path / "r.jsonl"
    command = [
        sys.executable, "-m", "retool.cli", "eval", "--endpoint", url, "--model", MODEL, "--data", str(data),
        "--max-turns", "3", "--out", str(out), "--sandbox-url", sandbox.base_url,
    ]  # fmt: skip
    done = subprocess.run(command, env=repo_env(MLFLOW_TRACKING_URI=""), capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"{failed} sample(s) did not complete" in done.stderr
    assert json.loads(done.stdout)["eval/errors"] == failed
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 2 and sum(1 for r in results if r["error"]) == failed


async def test_a_failing_endpoint_is_recorded_per_sample_not_fatal(endpoint, sandbox, tmp_path):
    """A request the endpoint refuses (HTTP 400, not retried) ends that sample with its error; the others complete."""
    from retool.evaluate.chat import ChatClient
    from retool.evaluate.problems import problem_from_row
    from retool.evaluate.runner import evaluate
    from retool.evaluate.tools import sandbox_tool, training_tool_schema
    from retool.recipe.reward.score import compute_score

    _, url = endpoint
    problems = [problem_from_row(PROBLEMS[0], 0), problem_from_row({"problem": "[unscripted] 1 + 1?", "answer": "2"}, 1)]
    chat = ChatClient(url, MODEL, retries=1, backoff_s=0.01)
    async with sandbox_tool(sandbox.base_url) as tool:
        results = await evaluate(
            problems, n=1, chat=chat, execute=tool, tools=[training_tool_schema()], score=compute_score, max_turns=3, concurrency=2, out=tmp_path / "r.jsonl"
        )
    await chat.aclose()
    ok, failed = results
    assert ok.acc and ok.error is None
    assert not failed.acc and failed.stop == "error" and "HTTP 400" in failed.error and "no script for this prompt" in failed.error
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2


async def test_demo_eval_set_prepared_and_solved_by_code(sandbox, tmp_path):
    """The demo's problems through `retool data prepare eval`, then evaluated: each is solved by code
    run in the sandbox, so a wrong shipped answer (or a broken prompt layout) fails here."""
    from retool.data import prepare_eval
    from retool.demo.samples import EVAL_FILE, EVAL_PROBLEMS

    prepared = tmp_path / "aime_demo.parquet"
    prepare_eval(str(EVAL_FILE), str(prepared), name="aime_demo")
    scripted = ScriptedEndpoint(model=MODEL, scripts=demo_scripts())
    assert len(scripted.scripts) == len(EVAL_PROBLEMS)
    with ServerThread(build_app(scripted)) as server:
        outcome = await run_eval(EvalConfig(endpoint=server.url, model=MODEL, data=prepared, n=1, sandbox_url=sandbox.base_url, out=tmp_path / "r.jsonl"))
    assert scripted.problems == []
    assert [r.pred for r in outcome.results] == [answer for _, answer in EVAL_PROBLEMS]
    assert outcome.summary["val-core/aime_demo/acc/mean@1"] == 1.0
