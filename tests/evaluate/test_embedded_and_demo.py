"""The embedded stack's process handling, and the demo's core run end to end against real servers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retool.demo.timings import timings_chart
from retool.embedded.process import ManagedServer, ServerStartError, free_port
from retool.tracking.bar_chart import png_size, render_png
from tests.conftest import REPO, repo_env
from tests.evaluate.scripted_endpoint import ScriptedEndpoint, ServerThread, build_app, demo_scripts


def gone(pid: int, within_s: float = 15.0) -> bool:
    """Whether the process has exited (zombies count as gone: only a parent's wait remains)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_server_that_exits_at_once_is_reported_with_its_log(tmp_path):
    server = ManagedServer(
        name="broken",
        argv=[sys.executable, "-c", "import sys; print('cannot bind: address in use'); sys.exit(3)"],
        base_url=f"http://127.0.0.1:{free_port()}",
        ready_path="/readyz",
        log_path=tmp_path / "broken.log",
        start_timeout_s=30,
    )
    with pytest.raises(ServerStartError, match=r"broken exited with code 3(.|\n)*cannot bind: address in use"):
        server.start()
    assert not server.running()


def test_server_that_never_gets_ready_is_stopped_with_its_children(tmp_path):
    """A server that forks a worker and never answers: the whole process group goes."""
    child_pid_file = tmp_path / "child.pid"
    script = group_with_a_child(child_pid_file)
    server = ManagedServer(
        name="silent",
        argv=[sys.executable, "-c", script],
        base_url=f"http://127.0.0.1:{free_port()}",
        ready_path="/health",
        log_path=tmp_path / "silent.log",
        start_timeout_s=60,
        start_wall_limit_s=3,
        stop_grace_s=5,
    )
    with pytest.raises(ServerStartError, match=r"did not answer .*/health within 3s \(it used \d+\.\d CPU seconds\)"):
        server.start()
    assert child_pid_file.exists()
    assert gone(int(child_pid_file.read_text()))


def test_a_server_that_spins_without_answering_is_stopped_after_its_cpu_budget_not_a_wall_clock(tmp_path):
    """The start limit counts the CPU the server's processes used, so a loaded machine (fewer CPU
    seconds per second) does not trip it, while a server that only burns CPU still fails."""
    spin = "import os\nif os.fork() == 0:\n    while True: pass\nwhile True: pass\n"
    server = ManagedServer(
        name="spinning",
        argv=[sys.executable, "-c", spin],
        base_url=f"http://127.0.0.1:{free_port()}",
        ready_path="/health",
        log_path=tmp_path / "spinning.log",
        start_timeout_s=2,
        start_wall_limit_s=300,
        stop_grace_s=5,
    )
    with pytest.raises(ServerStartError, match=r"did not answer .*/health within 2 CPU seconds"):
        server.start()
    assert not server.running()


@pytest.mark.slow
def test_demo_runs_for_real_keeps_mlflow_on_request_and_stops_it(tmp_path):
    """The demo's core as `make demo KEEP=1 EVAL_ENDPOINT=... EVAL_MODEL=...` runs it, the model being
    a scripted endpoint that solves the demo's problems with code. Its training (the rehearsal, ~9 min on 2
    cores) is tests/verl09/test_rehearsal.py's, down to the figures the demo prints (``summary_lines``)."""
    out = tmp_path / "demo"
    env = {k: v for k, v in repo_env().items() if k not in ("KEEP", "EVAL_ENDPOINT", "EVAL_MODEL")}
    scripted = ScriptedEndpoint(model="scripted-demo", scripts=demo_scripts())
    port = free_port()
    with ServerThread(build_app(scripted)) as endpoint:
        command = [
            sys.executable, "-m", "retool.demo", "--out", str(out), "--keep", "--mlflow-port", str(port), "--no-progress", "-v", "--no-train",
            "--eval-endpoint", endpoint.url, "--eval-model", "scripted-demo", "--eval-n", "2",
        ]  # fmt: skip
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=420, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert scripted.problems == []
    assert "eval         aime_demo mean@n 1.00; 1.0 tool calls and 2.0 turns per sample" in done.stdout
    assert len((out / "eval" / "results.jsonl").read_text().splitlines()) == 6 * 2

    # What it says, and where.
    assert "4 SFT trajectories, 6 code blocks re-run in the sandbox: 100% of outputs reproduced, 100% of answers correct" in done.stdout
    assert "the prepared SFT parquet keeps them: 100% of its 6 code blocks reproduced" in done.stdout
    servers = {name: (url, int(pid)) for name, url, pid in re.findall(r"(\w+) ready at (\S+) \(pid (\d+)\)", done.stderr)}
    assert set(servers) == {"sandbox", "mlflow"}
    assert gone(servers["sandbox"][1]), "the sandbox must stop with the demo"
    mlflow_url, mlflow_pid = servers["mlflow"]
    assert mlflow_url.startswith(f"http://127.0.0.1:{port}/"), "a kept MLflow listens on the port asked for"
    assert re.search(rf"MLflow run   http://127\.0\.0\.1:{port}/#/experiments/\d+/runs/[0-9a-f]{{32}}\?workflowType=machine_learning", done.stdout)
    assert not gone(mlflow_pid, within_s=0.5), "--keep leaves MLflow running"
    assert int((out / "mlflow.pid").read_text()) == mlflow_pid

    # The files it promises.
    report = json.loads((out / "data-check" / "report.json").read_text())
    assert report["ok"] is True and report["metrics"]["data_check/blocks"] == 6
    prepared_report = json.loads((out / "data-check-prepared" / "report.json").read_text())
    assert prepared_report["ok"] is True and prepared_report["metrics"]["data_check/blocks"] == 6
    import pyarrow.parquet as pq

    assert pq.read_table(out / "data" / "sft" / "train.parquet").num_rows == 4
    assert pq.read_table(out / "data" / "eval" / "aime_demo.parquet").num_rows == 6
    manifests = (out / "render" / "manifests.yaml").read_text()
    assert "kind: RayJob" in manifests and "kind: Deployment" in manifests
    assert "main_ppo" in (out / "render" / "commands" / "rl.sh").read_text()
    assert sorted(p.name for p in (out / "render" / "commands").iterdir()) == ["eval.sh", "merge.sh", "preflight.sh", "prepare.sh", "rl.sh", "sft.sh"]

    # The MLflow run, read back from the server that was kept.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_url.removesuffix("/health"))
    experiment = client.get_experiment_by_name("retool-demo")
    assert experiment.tags["mlflow.experimentKind"] == "finetuning", "MLflow's UI opens the demo's experiment on its runs"
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"demo", "demo-eval-scripted-demo"}
    assert runs["demo-eval-scripted-demo"].data.metrics["val-core/aime_demo/acc/mean_at_2"] == 1.0
    run = runs["demo"]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["data_check/output_agreement"] == 1.0
    assert run.data.metrics["data_check/answer_accuracy"] == 1.0
    assert run.data.params["example"] == "retoolrun-qwen32b-h200.yaml"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"data-check", "data-check-prepared", "manifests.yaml", "commands", "charts"}
    # The pictures (previewed by MLflow's artifact view): the check per trajectory, and every step's time.
    assert {a.path for a in client.list_artifacts(run.info.run_id, "data-check")} >= {"data-check/blocks.png", "data-check/report.json"}
    timings = Path(client.download_artifacts(run.info.run_id, "charts/timings.png", str(tmp_path / "downloaded")))
    assert png_size(timings.read_bytes())[0] > 0
    steps = ("start_stack", "prepare", "data_check", "render", "eval", "mlflow")  # the order they ran; no training here
    logged_seconds = {step: client.get_run(run.info.run_id).data.metrics[f"demo/seconds/{step}"] for step in steps}
    assert timings.read_bytes() == render_png(timings_chart(logged_seconds)), "the chart draws the run's own step timings"
    assert run.data.metrics["data_check_prepared/output_agreement"] == 1.0
    assert "data_check_prepared/answer_accuracy" not in run.data.metrics, "the prepared parquet has no answers: nothing was scored, so no 0 is logged"

    # `make demo-stop`.
    stopped = subprocess.run([sys.executable, "-m", "retool.demo", "--out", str(out), "--stop"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert stopped.returncode == 0 and "stopped the demo's MLflow server" in stopped.stdout
    assert gone(mlflow_pid)
    assert not (out / "mlflow.pid").exists()


@pytest.mark.parametrize("serving", [None, "another-model"], ids=["unreachable", "another model"])
def test_an_eval_endpoint_that_cannot_serve_fails_the_demo_before_anything_starts(tmp_path, serving):
    """`make demo EVAL_ENDPOINT=... EVAL_MODEL=nope`: one GET /v1/models before anything starts or is deleted
    (issue 50, item 4: the stack and the data steps ran first, then 96 warnings and no next step)."""
    env = {k: v for k, v in repo_env().items() if k not in ("KEEP", "EVAL_ENDPOINT", "EVAL_MODEL")}
    last = tmp_path / "demo" / "data-check" / "report.md"
    last.parent.mkdir(parents=True)
    last.write_text("the last demo's report")
    with contextlib.ExitStack() as stack:
        endpoint = ScriptedEndpoint(model=serving or "", scripts={})
        url = f"http://127.0.0.1:{free_port()}" if serving is None else stack.enter_context(ServerThread(build_app(endpoint))).url
        command = [
            sys.executable, "-m", "retool.demo", "--out", str(tmp_path / "demo"), "--no-progress", "--no-train",
            "--eval-endpoint", url, "--eval-model", "nope", "--eval-n", "1",
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retool demo: EVAL_ENDPOINT: "), done.stderr
    if serving is None:
        assert f"cannot reach {url}/v1/models" in lines[0] and "start the model server there" in lines[0]
    else:
        assert "does not serve 'nope'; it serves: another-model" in lines[0]
    assert time.monotonic() - started < 60
    assert not (tmp_path / "demo" / "mlflow").exists(), "nothing was started"
    assert last.read_text() == "the last demo's report", "a refused demo deleted the last one's results"


def test_stop_without_a_kept_server_says_so(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "retool.demo", "--out", str(tmp_path), "--stop"], env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "no demo MLflow server was running" in done.stdout


def test_demo_rejects_a_missing_example_before_starting_anything(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "retool.demo", "--out", str(tmp_path / "d"), "--example", "nope.yaml"],
        env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "nope.yaml: no such file" in done.stderr
    assert not (tmp_path / "d").exists()


def group_with_a_child(child_file: Path) -> str:
    """Python source of a process that starts a sleeping child, records the child's pid, and sleeps."""
    return (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(child_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )


def test_stop_previous_mlflow_stops_the_kept_group(tmp_path):
    from retool.demo.pipeline import stop_previous_mlflow

    pid_file, child_file = tmp_path / "mlflow.pid", tmp_path / "child.pid"
    leader = subprocess.Popen([sys.executable, "-c", group_with_a_child(child_file)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not child_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid_file.write_text(str(leader.pid))
    assert stop_previous_mlflow(pid_file) is True
    leader.wait(timeout=15)
    assert gone(int(child_file.read_text()))
    assert not pid_file.exists()


def test_stop_previous_mlflow_with_a_stale_pid_file(tmp_path):
    from retool.demo.pipeline import stop_previous_mlflow

    finished = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    finished.wait()  # exited and reaped: its id names no process group any more
    pid_file = tmp_path / "mlflow.pid"
    pid_file.write_text(str(finished.pid))
    assert stop_previous_mlflow(pid_file) is False
    assert not pid_file.exists()


def test_a_demo_that_stops_mlflow_prints_no_link_to_it(tmp_path):
    from retool.demo.pipeline import DEMO_MLFLOW_PORT, DemoSummary, summary_text

    figures = {"data_check/trajectories": 4, "data_check/blocks": 6, "data_check/output_agreement": 1.0, "data_check/answer_accuracy": 1.0}
    figures |= {"data_check_prepared/output_agreement": 1.0, "data_check_prepared/blocks": 6, "demo/render/objects": 12}
    run_url = "http://127.0.0.1:5055/#/experiments/1/runs/" + "a" * 32 + "?workflowType=machine_learning"
    summary = DemoSummary(
        mlflow_url="http://127.0.0.1:5055", run_url=run_url, report=tmp_path / "report.md", manifests=tmp_path / "render" / "manifests.yaml",
        commands={}, prepared={}, figures=figures, check_ok=True, seconds={},
    )  # fmt: skip
    stopped = summary_text(summary)
    assert "/#/experiments/" not in stopped and f"keeps MLflow running at http://127.0.0.1:{DEMO_MLFLOW_PORT}" in stopped
    summary.kept_mlflow_pid = 4242
    kept = summary_text(summary)
    assert f"MLflow run   {run_url}" in kept and "make demo-stop" in kept


def test_the_closing_hint_never_names_a_taken_port(tmp_path):
    """Issue 50, item 6: the hint said `make demo KEEP=1` and 5055 while 5055 was taken, which the next demo refuses."""
    import socket

    from retool.demo.pipeline import DEMO_MLFLOW_PORT, DemoSummary, keep_hint_port, port_in_use, summary_text

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        offered = keep_hint_port(taken)
        assert offered != taken and not port_in_use(offered)
    assert keep_hint_port(offered) == offered, "a free configured port is offered as it is"
    summary = DemoSummary(
        mlflow_url="http://127.0.0.1:1", run_url="", report=tmp_path / "report.md", manifests=tmp_path / "manifests.yaml", commands={}, prepared={},
        figures={"data_check/trajectories": 4, "data_check/blocks": 6, "data_check/output_agreement": 1.0, "data_check/answer_accuracy": 1.0,
                 "data_check_prepared/output_agreement": 1.0, "data_check_prepared/blocks": 6, "demo/render/objects": 12},
        check_ok=True, keep_port=offered,
    )  # fmt: skip
    text = summary_text(summary)
    assert f"`make demo KEEP=1 MLFLOW_PORT={offered}` keeps MLflow running at http://127.0.0.1:{offered}" in text
    assert f":{DEMO_MLFLOW_PORT}" not in text or offered == DEMO_MLFLOW_PORT


def test_a_kept_demo_refuses_a_busy_port_before_starting_anything(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in repo_env().items() if k not in ("KEEP", "EVAL_ENDPOINT", "EVAL_MODEL", "MLFLOW_PORT")}
        last = tmp_path / "demo" / "data-check" / "report.md"  # what the last demo left, to be browsed
        last.parent.mkdir(parents=True)
        last.write_text("the last demo's report")
        command = [sys.executable, "-m", "retool.demo", "--out", str(tmp_path / "demo"), "--keep", "--mlflow-port", str(port), "--no-progress", "--no-train"]
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr
    assert not (tmp_path / "demo" / "mlflow").exists(), "nothing was started"
    assert last.read_text() == "the last demo's report", "a refused demo deleted the last one's results (issue 50, item 3)"


def test_scans_of_proc_tolerate_a_process_that_ends_while_they_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50 item 8: a process that ends mid-scan answers ESRCH (``ProcessLookupError``) for its /proc entry; the
    scans skip it. The ending is made certain: that one process's entry answers as an ending process does
    (``os.stat`` and ``open`` of its ``stat``: ESRCH), while it stays listed in /proc."""
    import builtins

    from retool.embedded import process

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = f"/proc/{victim.pid}/stat"
    real_stat, real_open = os.stat, builtins.open

    def stat(target, *args, **kwargs):
        if os.fspath(target) == path:
            raise ProcessLookupError(3, "No such process", path)
        return real_stat(target, *args, **kwargs)

    def opener(target, *args, **kwargs):
        if isinstance(target, (str, Path)) and os.fspath(target) == path:
            raise ProcessLookupError(3, "No such process", path)
        return real_open(target, *args, **kwargs)

    try:
        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(builtins, "open", opener)
        assert str(victim.pid) in os.listdir("/proc")
        assert not process.group_alive(victim.pid), "the ending process is not counted as alive"
        assert process.session_cpu_seconds(os.getsid(0)) >= 0
        assert victim.pid not in {pid for pid, _ in process.proc_stats()}
    finally:
        monkeypatch.undo()
        victim.kill()
        victim.wait()


def test_a_new_demo_replaces_the_last_ones_outputs_but_keeps_its_mlflow_store(tmp_path):
    """Issue 50 item 2: runs accumulate across demos (and MLflow starts on an existing database)."""
    from retool.demo.pipeline import PREVIOUS_OUTPUTS, clear_previous_outputs

    out = tmp_path / "demo"
    for name in (*PREVIOUS_OUTPUTS, "mlflow"):
        (out / name).mkdir(parents=True)
        (out / name / "file").write_text(name)
    clear_previous_outputs(out)
    assert sorted(p.name for p in out.iterdir()) == ["mlflow"]
    assert (out / "mlflow" / "file").read_text() == "mlflow"
