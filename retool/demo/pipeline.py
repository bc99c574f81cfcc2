"""The local demo: the platform working for real on an embedded stack, training included.

1. start our sandbox and an MLflow server (sqlite, local artifacts) on 127.0.0.1;
2. prepare SFT and eval data from the sample files shipped in ``retool/demo/data``;
3. check the SFT trajectories against the sandbox (``retool data check``): the shipped file
   (answers scored) and the prepared parquet (preparation kept every block with its output);
4. log a run to MLflow: params, the figures, the report and the rendered files as artifacts;
5. render the Kubernetes objects and per-stage verl commands of a RetoolRun example;
6. train: the training rehearsal (``retool.rehearsal``), a tiny model through every stage's own
   command, prepare -> preflight -> sft -> merge -> rl -> eval, logged to the same MLflow;
7. stop what it started, unless asked to keep MLflow running.

Everything lands under one output directory (``build/demo``); a previous demo's MLflow kept
running there is stopped first, so the demo never leaves two servers behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from retool.data_check.app import CheckConfig, CheckOutcome, run_check
from retool.demo.prepare import prepare_samples
from retool.demo.render import render_run
from retool.demo.samples import EVAL_FILE, SFT_FILE
from retool.demo.timings import CHART_PATH as TIMINGS_CHART
from retool.demo.timings import timings_chart
from retool.embedded.process import ManagedServer, free_port, group_alive
from retool.embedded.servers import mlflow_server, sandbox_server
from retool.evaluate.app import EvalConfig, EvalOutcome, run_eval
from retool.evaluate.chat import EndpointError, check_served
from retool.evaluate.mlflow_log import log_run
from retool.rehearsal.pipeline import RehearsalConfig, StageFailedError, set_up
from retool.rehearsal.summary import RehearsalSummary, summarize, summary_lines
from retool.tracking.bar_chart import write_png

logger = logging.getLogger(__name__)

REPO_EXAMPLE = Path("examples/retoolrun-qwen32b-h200.yaml")
EXPERIMENT = "retool-demo"
DEMO_MLFLOW_PORT = 5055
"""Where ``make demo KEEP=1`` serves MLflow (the same link every time; ``MLFLOW_PORT=...`` to change it).
A demo that stops MLflow at its end takes any free port and prints no link."""


@dataclass(frozen=True)
class DemoConfig:
    out: Path = Path("build/demo")
    example: Path = REPO_EXAMPLE
    keep: bool = False
    """Leave MLflow running after the demo (``make demo KEEP=1``)."""
    mlflow_port: int = DEMO_MLFLOW_PORT
    """The port MLflow is kept on (only with ``keep``)."""
    progress: bool = True
    sandbox_workers: int = 2
    eval_endpoint: str | None = None
    """An OpenAI-compatible server to evaluate on the demo's eval set with ``retool eval`` (optional)."""
    eval_model: str | None = None
    eval_n: int = 4
    train: bool = True
    """Run the training rehearsal after the other steps (``make demo TRAIN=0`` skips it)."""
    trainer_python: Path = Path(".venv-verl09/bin/python")
    """The trainer environment the rehearsal's stages run in (verl 0.9.1, ``make install-verl09``)."""


@dataclass
class DemoSummary:
    mlflow_url: str
    run_url: str
    report: Path
    manifests: Path
    commands: dict[str, Path]
    prepared: dict[str, Path]
    figures: dict[str, float]
    check_ok: bool
    kept_mlflow_pid: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    evaluation: EvalOutcome | None = None
    training: RehearsalSummary | None = None
    training_failure: str | None = None
    keep_port: int = DEMO_MLFLOW_PORT
    """The port the closing hint offers for ``KEEP=1``: the configured one, or a free one when that is taken."""


def stop_previous_mlflow(pid_file: Path) -> bool:
    """Stop an MLflow a previous ``KEEP=1`` demo left running: the process group it recorded.

    Returns whether one was running. The pid file is removed either way.
    """
    if not pid_file.exists():
        return False
    try:
        pgid = int(pid_file.read_text().strip())
    except ValueError:
        pid_file.unlink()
        return False
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):  # gone already, or the id now belongs to another user
        pid_file.unlink()
        return False
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    pid_file.unlink()
    logger.info("stopped the MLflow server a previous demo kept running (process group %d)", pgid)
    return True


def start_stack(servers: list[ManagedServer], progress: bool) -> None:
    """Start the servers concurrently (MLflow alone takes many seconds), one tick per server ready.

    Waits for every start to finish before raising the first failure, so the caller's cleanup
    never races a server that is still starting.
    """
    with tqdm(total=len(servers), desc="start embedded stack", unit="server", disable=not progress) as bar, ThreadPoolExecutor(len(servers)) as pool:
        futures = [pool.submit(server.start) for server in servers]
        for future in as_completed(futures):
            if future.exception() is None:
                bar.update(1)
        failures = [future.exception() for future in futures]
    first = next((f for f in failures if f is not None), None)
    if first is not None:
        raise first


def _timed(seconds: dict[str, float], name: str, step: Callable[[], object]) -> object:
    started = time.monotonic()
    try:
        return step()
    finally:
        seconds[name] = round(time.monotonic() - started, 2)


class DemoSetupError(ValueError):
    """The demo cannot start as configured (said before anything is started)."""


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def keep_hint_port(configured: int) -> int:
    """The port the closing hint offers for ``KEEP=1``: the configured one while it is free, else a free one
    (a hint that names a taken port leads to the refusal above)."""
    return configured if not port_in_use(configured) else free_port()


PREVIOUS_OUTPUTS = ("data", "data-check", "data-check-prepared", "render", "eval", "logs", "train", "charts")
"""What a demo replaces of the last one's outputs. Not ``mlflow``: its database and artifacts stay, so
every demo's runs accumulate under the ``retool-demo`` experiment (compare one demo with the last in
MLflow's UI) and the server starts on a database that exists instead of creating and migrating one."""


def clear_previous_outputs(out: Path) -> None:
    """Remove the last demo's outputs but its MLflow store (``PREVIOUS_OUTPUTS``)."""
    for stale in PREVIOUS_OUTPUTS:
        shutil.rmtree(out / stale, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def run_demo(config: DemoConfig) -> DemoSummary:
    if config.eval_endpoint and not config.eval_model:
        raise ValueError("an eval endpoint needs a model name (EVAL_MODEL / --eval-model)")
    out = config.out.resolve()
    pid_file = out / "mlflow.pid"
    stop_previous_mlflow(pid_file)  # a kept MLflow of the last demo holds the port the check below asks for
    # Every precondition before anything is deleted (issue 50): a refused demo leaves the last one's results.
    if config.keep and port_in_use(config.mlflow_port):
        raise DemoSetupError(f"port {config.mlflow_port} on 127.0.0.1 is in use: stop what holds it, or keep MLflow on another port (MLFLOW_PORT=... / --mlflow-port)")
    if config.eval_endpoint:
        try:
            check_served(config.eval_endpoint, config.eval_model or "")
        except EndpointError as err:
            raise DemoSetupError(f"EVAL_ENDPOINT: {err} (EVAL_MODEL={config.eval_model}; without EVAL_ENDPOINT the demo skips this evaluation)") from None
    clear_previous_outputs(out)
    seconds: dict[str, float] = {}
    sandbox = sandbox_server(out / "logs", workers=config.sandbox_workers)
    mlflow = mlflow_server(out / "mlflow", port=config.mlflow_port if config.keep else None)
    kept_pid = None
    try:
        _timed(seconds, "start_stack", lambda: start_stack([sandbox, mlflow], config.progress))
        prepared = _timed(seconds, "prepare", lambda: prepare_samples(SFT_FILE, EVAL_FILE, out / "data", progress=config.progress))
        # The shipped trajectories carry their answers (the prepared SFT layout has no answer
        # column), so checking them scores every final answer; checking the prepared parquet too
        # shows that preparation kept every code block with its output.
        check, check_prepared = _timed(
            seconds,
            "data_check",
            lambda: (
                _check(SFT_FILE, out / "data-check", sandbox.base_url, config.progress, "data check"),
                _check(prepared.sft, out / "data-check-prepared", sandbox.base_url, config.progress, "data check (prepared parquet)"),
            ),
        )
        rendered = _timed(seconds, "render", lambda: _render(config.example, out / "render", config.progress))
        evaluation = None
        if config.eval_endpoint:
            eval_config = EvalConfig(
                endpoint=config.eval_endpoint,
                model=config.eval_model or "",
                data=prepared.eval,
                n=config.eval_n,
                sandbox_url=sandbox.base_url,
                out=out / "eval" / "results.jsonl",
                mlflow_uri=mlflow.base_url,
                experiment=EXPERIMENT,
                run_name=f"demo-eval-{config.eval_model}",
            )
            evaluation = _timed(seconds, "eval", lambda: asyncio.run(run_eval(eval_config, progress=config.progress)))
        prepared_figures = {k.replace("data_check/", "data_check_prepared/", 1): v for k, v in check_prepared.report.metrics().items()}
        figures = {
            **check.report.metrics(),
            **prepared_figures,
            **prepared.figures(),
            "demo/render/objects": float(len(rendered.kinds)),
            "demo/render/stages": float(len(rendered.commands)),
        }
        artifacts = [out / "data-check", out / "data-check-prepared", rendered.manifests, out / "render" / "commands"]
        with tqdm(total=1 + len(artifacts), desc="log run to MLflow", unit="step", disable=not config.progress) as bar:
            logged = _timed(
                seconds,
                "mlflow",
                lambda: log_run(
                    mlflow.base_url,
                    EXPERIMENT,
                    run_name="demo",
                    params={"example": config.example.name, "sft_samples": SFT_FILE.name, "eval_samples": EVAL_FILE.name, "sandbox_workers": config.sandbox_workers},
                    metrics={**figures, **{f"demo/seconds/{k}": v for k, v in seconds.items()}},
                    artifacts=artifacts,
                    tags={"retool.kind": "demo", "retool.check_ok": str(check.report.ok and check_prepared.report.ok).lower()},
                    on_step=lambda: bar.update(1),
                ),
            )
        training, training_failure = None, None
        if config.train:
            training, training_failure = _timed(seconds, "train", lambda: _train(config, out / "train", sandbox.base_url, mlflow.base_url))
        _log_timings(mlflow.base_url, logged.run_id, seconds, out / "charts")
        if config.keep:
            pid_file.write_text(str(mlflow.pid))
            kept_pid = mlflow.pid
        return DemoSummary(
            mlflow_url=mlflow.base_url,
            run_url=logged.url,
            report=check.markdown_path,
            manifests=rendered.manifests,
            commands=rendered.commands,
            prepared={"sft": prepared.sft, "eval": prepared.eval},
            figures=figures,
            check_ok=check.report.ok and check_prepared.report.ok,
            kept_mlflow_pid=kept_pid,
            seconds=seconds,
            evaluation=evaluation,
            training=training,
            training_failure=training_failure,
            keep_port=keep_hint_port(config.mlflow_port),
        )
    finally:
        sandbox.stop()
        if kept_pid is None:
            mlflow.stop()


def _log_timings(tracking_uri: str, run_id: str, seconds: Mapping[str, float], out_dir: Path) -> None:
    """Every step's time, training included, as a chart on the demo's run, and the figures of the steps that
    ended after the run was logged (``demo/seconds/mlflow``, ``demo/seconds/train``) beside the others."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    logged = client.get_run(run_id).data.metrics
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(f"demo/seconds/{step}", value, now, 0) for step, value in seconds.items() if f"demo/seconds/{step}" not in logged])
    path = write_png(timings_chart(seconds), out_dir / Path(TIMINGS_CHART).name)
    client.log_artifact(run_id, str(path), str(Path(TIMINGS_CHART).parent))


def _train(config: DemoConfig, out: Path, sandbox_url: str, mlflow_uri: str) -> tuple[RehearsalSummary | None, str | None]:
    """The training rehearsal on the demo's stack: its summary, or why it failed (the demo's other results stand)."""
    rehearsal = set_up(RehearsalConfig(out=out, python=config.trainer_python.absolute(), sandbox_url=sandbox_url, mlflow_uri=mlflow_uri, progress=config.progress))
    try:
        rehearsal.run_all()
    except StageFailedError as err:
        return None, str(err)
    return summarize(rehearsal), None


def _check(file: Path, out_dir: Path, sandbox_url: str, progress: bool, label: str) -> CheckOutcome:
    return asyncio.run(run_check(CheckConfig(file=file, out_dir=out_dir, sandbox_url=sandbox_url, concurrency=4), progress=progress, label=label))


def _render(example: Path, out_dir: Path, progress: bool):
    with tqdm(desc="render manifests and commands", unit="file", disable=not progress) as bar:
        return render_run(example, out_dir, on_file=lambda _path: bar.update(1))


def eval_failures(evaluation: EvalOutcome | None) -> int:
    """Samples of the asked-for evaluation that did not complete (the endpoint kept failing); 0 without one."""
    return int(evaluation.summary.get("eval/errors", 0)) if evaluation is not None else 0


def demo_ok(summary: DemoSummary) -> bool:
    """The demo's verdict (its exit status): the data checks passed and an asked-for evaluation
    completed every sample, as ``retool eval`` alone requires; a mistyped endpoint is a failure,
    not a model that scored 0."""
    return summary.check_ok and eval_failures(summary.evaluation) == 0 and summary.training_failure is None


def _eval_lines(evaluation: EvalOutcome | None) -> list[str]:
    if evaluation is None:
        return []
    figures = evaluation.summary
    errors, samples = eval_failures(evaluation), int(figures.get("eval/samples", 0))
    first_error = next((r.error for r in evaluation.results if r.error), None)
    accuracy = {k.split("/")[1]: v for k, v in figures.items() if k.startswith("val-core/") and "/acc/mean@" in k}
    if not accuracy:
        return [
            f"  eval         FAILED: none of {samples} sample(s) completed at the endpoint, nothing was scored (first error: {first_error})",
            f"  eval results {evaluation.results_path}",
        ]
    scores = ", ".join(f"{source} mean@n {value:.2f}" for source, value in accuracy.items())
    failed = f"; FAILED: {errors} of {samples} sample(s) did not complete at the endpoint and are not scored (first error: {first_error})" if errors else ""
    return [
        f"  eval         {scores}; {figures['eval/tool_calls_mean']:.1f} tool calls and {figures['eval/turns_mean']:.1f} turns per sample{failed}",
        f"  eval results {evaluation.results_path} (also in MLflow)",
    ]


def _training_lines(summary: DemoSummary) -> list[str]:
    if summary.training_failure:
        return ["Training rehearsal FAILED:", *("  " + line for line in summary.training_failure.splitlines()), ""]
    if summary.training is None:
        return []
    lines = ["Training rehearsal (a tiny Qwen2.5 through every stage's own command, on CPU; docs/rehearsal.md):", *summary_lines(summary.training)]
    if not summary.kept_mlflow_pid:
        lines[-1] += " (gone with MLflow: make demo KEEP=1 to browse it)"
    return [*lines, ""]


def _share(figures: dict[str, float], name: str) -> str:
    """A share as a percentage, or "n/a" where nothing was measured (the figure is absent)."""
    return f"{figures[name]:.0%}" if name in figures else "n/a"


def summary_text(summary: DemoSummary) -> str:
    """What the demo prints at the end: where to look, and the figures that matter."""
    f = summary.figures
    problems = [
        *(["the data check found problems, see the report"] if not summary.check_ok else []),
        *([f"the evaluation could not complete {eval_failures(summary.evaluation)} sample(s) at its endpoint"] if eval_failures(summary.evaluation) else []),
        *(["the training rehearsal failed, see below"] if summary.training_failure else []),
    ]
    lines = [
        "",
        "ReTool platform demo: " + (f"FAILED: {'; '.join(problems)}" if problems else "done"),
        "",
        f"  data check   {int(f['data_check/trajectories'])} SFT trajectories, {int(f['data_check/blocks'])} code blocks re-run in the sandbox: "
        f"{_share(f, 'data_check/output_agreement')} of outputs reproduced, {_share(f, 'data_check/answer_accuracy')} of answers correct",
        f"               the prepared SFT parquet keeps them: {_share(f, 'data_check_prepared/output_agreement')} of its "
        f"{int(f['data_check_prepared/blocks'])} code blocks reproduced",
        f"  report       {summary.report}",
        f"  prepared     {', '.join(str(p) for p in summary.prepared.values())}",
        f"  manifests    {summary.manifests} ({int(f['demo/render/objects'])} Kubernetes objects)",
        f"  commands     {summary.manifests.parent / 'commands'}/ ({', '.join(summary.commands)})",
        *([f"  MLflow run   {summary.run_url}"] if summary.kept_mlflow_pid else []),
        *_eval_lines(summary.evaluation),
        f"  timings      {', '.join(f'{k} {v:.1f}s' for k, v in summary.seconds.items())}",
        "",
        *_training_lines(summary),
    ]
    if summary.kept_mlflow_pid:
        lines += [
            f"MLflow keeps running at {summary.mlflow_url} (process group {summary.kept_mlflow_pid}); stop it with `make demo-stop`.",
            "",
        ]
    else:
        keep = "make demo KEEP=1" + ("" if summary.keep_port == DEMO_MLFLOW_PORT else f" MLFLOW_PORT={summary.keep_port}")
        lines += [f"Everything the demo started has been stopped; `{keep}` keeps MLflow running at http://127.0.0.1:{summary.keep_port} to browse the run.", ""]
    return "\n".join(lines)
