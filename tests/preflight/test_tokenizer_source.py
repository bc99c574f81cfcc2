"""Where `retool preflight` reads the tokenizer, and a source that cannot be one said in one line
(transformers would answer a missing directory with HFValidationError about repo ids, and a
directory without tokenizer files with a TypeError)."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from retool.cli.inputs import InputError
from retool.cli.preflight import default_tokenizer
from retool.embedded.process import free_port
from retool.preflight.tokenizer_files import tokenizer_source_problem
from retool.runtime.paths import staged_model_path
from retool.spec.validate import parse_run
from tests.conftest import REPO, repo_env


def source(tmp_path: Path, kind: str) -> str:
    if kind == "tokenizer dir":
        (tmp_path / "tok").mkdir()
        (tmp_path / "tok" / "tokenizer.json").write_text("{}")
        return str(tmp_path / "tok")
    if kind == "empty dir":
        (tmp_path / "empty").mkdir()
        return str(tmp_path / "empty")
    if kind == "file":
        (tmp_path / "tokenizer.json").write_text("{}")
        return str(tmp_path / "tokenizer.json")
    return {"missing dir": str(tmp_path / "models" / "base"), "relative missing": "./models/base", "hub id": "Qwen/Qwen2.5-7B-Instruct", "hub name": "gpt2"}[kind]


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("tokenizer dir", None),
        ("hub id", None),
        ("hub name", None),
        ("empty dir", "has no tokenizer files (expected one of tokenizer.json, tokenizer.model"),
        ("file", "is a file; expected a directory with the model's tokenizer files"),
        ("missing dir", "no such directory"),
        ("relative missing", "no such directory"),
    ],
    ids=lambda v: str(v),
)
def test_a_tokenizer_source_that_cannot_load_says_why(tmp_path: Path, kind: str, problem: str | None) -> None:
    found = tokenizer_source_problem(source(tmp_path, kind))
    assert found == problem if problem is None else problem in found


def example(name: str, **storage: str) -> object:
    document = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    if storage:
        document["spec"]["storage"] = {"pvc": {"claimName": "local", **storage}}
    return parse_run(document)


def test_without_a_staged_copy_the_cli_reads_the_hub_id_the_spec_names(tmp_path: Path) -> None:
    run = example("retoolrun-minimal", mountPath=str(tmp_path))
    assert default_tokenizer(run) == "Qwen/Qwen2.5-32B-Instruct" == run.spec.model.base


def test_a_staged_copy_is_read_as_the_preflight_stage_reads_it(tmp_path: Path) -> None:
    run = example("retoolrun-minimal", mountPath=str(tmp_path))
    Path(staged_model_path(run)).mkdir(parents=True)
    assert default_tokenizer(run) == staged_model_path(run)


def test_an_s3_model_needs_the_tokenizer_flag(tmp_path: Path) -> None:
    run = example("retoolrun-minimal", mountPath=str(tmp_path))
    run.spec.model.base = "s3://models/qwen"
    with pytest.raises(InputError, match=r"--tokenizer is needed: spec\.model\.base is s3://models/qwen"):
        default_tokenizer(run)


@pytest.mark.slow
def test_retool_preflight_with_an_empty_tokenizer_directory_fails_the_tokenizer_check_in_one_line(tmp_path: Path) -> None:
    """A text-only run (no sandbox to wait for) and a tokenizer directory without files: exit 11, the
    tokenizer check, naming the directory, not a TypeError from transformers."""
    empty = tmp_path / "tokenizer"
    empty.mkdir()
    spec = REPO / "examples" / "retoolrun-qwen32b-h200-text-only.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "retool.cli", "preflight", str(spec), "--tokenizer", str(empty), "--mount-path", str(tmp_path / "pvc"), "--report-dir", str(tmp_path / "r")],
        cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 11, proc.stdout + proc.stderr[-3000:]
    verdict = proc.stdout.strip().splitlines()[-1]
    assert f"the tokenizer did not load: {empty} has no tokenizer files" in verdict
    assert "TypeError" not in proc.stdout + proc.stderr and "HFValidationError" not in proc.stdout + proc.stderr


class _Hub(http.server.BaseHTTPRequestHandler):
    """A model hub that has no model at all (every file 404), as the hub answers a mistyped id."""

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("hub", ["unreachable", "no such model"])
def test_a_hub_tokenizer_the_hub_cannot_give_fails_at_once_naming_the_way_around(tmp_path: Path, hub: str) -> None:
    """Issue 50, item 5: without the hub, transformers retried for ~46 s (22 warnings), then named the tokenizer but
    neither --tokenizer nor the offline setting. One request now decides (HF_ENDPOINT points the hub here)."""
    spec = REPO / "examples" / "retoolrun-minimal.yaml"
    with contextlib.ExitStack() as stack:
        if hub == "unreachable":
            endpoint = f"http://127.0.0.1:{free_port()}"
        else:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
            stack.enter_context(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.shutdown)
            endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        env = {k: v for k, v in repo_env(HF_ENDPOINT=endpoint).items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "retool.cli", "preflight", str(spec), "--mount-path", str(tmp_path / "pvc"), "--report-dir", str(tmp_path / "r")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()[-1]
    assert "WARNING" not in proc.stderr and "etry" not in proc.stderr, proc.stderr
    assert "--tokenizer Qwen/Qwen2.5-32B-Instruct: " in error and "pass --tokenizer DIR" in error and "HF_HUB_OFFLINE=1" in error
    assert ("the model hub does not answer" if hub == "unreachable" else "nor model on the hub") in error
    assert time.monotonic() - started < 30, "one request decides, not transformers' retries"
    assert not (tmp_path / "r").exists(), "nothing was started"
