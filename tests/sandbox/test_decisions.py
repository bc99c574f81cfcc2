"""Pure decisions of the sandbox, table-tested: limits, statuses, output caps, paths, validation, backoff."""

from __future__ import annotations

import random
import resource

import pytest

from retool.sandbox import protocol
from retool.sandbox.api import RunCodeRequest
from retool.sandbox.client import backoff_delay, parse_retry_after
from retool.sandbox.outcome import MIB, Limits, checked_relative_path, render_output, rlimits, signal_note, verdict
from retool.sandbox.pool import Job, template_env
from retool.sandbox.responses import WORKER_DIED, build_response
from retool.sandbox.server import InvalidRequestError, job_from_request
from retool.sandbox.settings import SandboxSettings

LIMITS = Limits(run_timeout_s=2.5, memory_limit_mb=100, max_processes=64, max_file_size_mb=8, max_open_files=128)


def test_rlimits_are_hard_and_count_memory_on_top_of_the_warm_interpreter() -> None:
    limits = rlimits(LIMITS, baseline_vm_bytes=300 * MIB, processes_in_use=5)
    assert limits[resource.RLIMIT_AS] == (400 * MIB, 400 * MIB)
    assert limits[resource.RLIMIT_CPU] == (4, 5)
    assert limits[resource.RLIMIT_NPROC] == (69, 69)
    assert limits[resource.RLIMIT_FSIZE] == (8 * MIB, 8 * MIB)
    assert limits[resource.RLIMIT_NOFILE] == (128, 128)
    assert resource.RLIMIT_STACK not in limits
    assert all(soft == hard for res, (soft, hard) in limits.items() if res != resource.RLIMIT_CPU)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"exit_code": 0, "term_signal": None, "timed_out": False}, ("Finished", "Success", 0)),
        ({"exit_code": 1, "term_signal": None, "timed_out": False}, ("Finished", "Failed", 1)),
        ({"exit_code": None, "term_signal": 11, "timed_out": False}, ("Finished", "Failed", -11)),
        ({"exit_code": None, "term_signal": 9, "timed_out": True}, ("TimeLimitExceeded", "Failed", None)),
        ({"exit_code": 0, "term_signal": None, "timed_out": True}, ("TimeLimitExceeded", "Failed", None)),
    ],
    ids=[
        "exit 0 is success",
        "exit 1 finished but failed (as SandboxFusion)",
        "a signal finished with a negative code",
        "timeout has no return code",
        "timeout wins over a clean exit",
    ],
)
def test_verdict(kwargs: dict, expected: tuple) -> None:
    decided = verdict(**kwargs)
    assert (decided.run_status, decided.status, decided.return_code) == expected


@pytest.mark.parametrize(
    ("term_signal", "timed_out", "note"),
    [(None, False, ""), (11, False, "Killed by SIGSEGV"), (24, False, "Killed by SIGXCPU: CPU time limit exceeded"), (9, True, "")],
    ids=["no signal", "segfault", "cpu limit", "timeouts say nothing more"],
)
def test_signal_note(term_signal: int | None, timed_out: bool, note: str) -> None:
    assert signal_note(term_signal, timed_out) == note


@pytest.mark.parametrize(
    ("kept", "total", "expected"),
    [
        (b"abc", 3, "abc"),
        (b"abc", 10, "abc\n[output truncated: 10 bytes written, only the first 3 kept]\n"),
        ("é".encode()[:1], 5, "\ufffd\n[output truncated: 5 bytes written, only the first 3 kept]\n"),
    ],
    ids=["untruncated", "truncated gets a marker", "a cut multibyte character is replaced"],
)
def test_render_output(kept: bytes, total: int, expected: str) -> None:
    assert render_output(kept, total, 3) == expected


@pytest.mark.parametrize(
    ("path", "normal"),
    [("a.txt", "a.txt"), ("d/./e/../f.txt", "d/f.txt"), ("d//g", "d/g"), ("d/" * 63 + "f", "d/" * 63 + "f")],
    ids=["plain", "dots", "double slash", "64 components is the most"],
)
def test_relative_paths_are_normalised(path: str, normal: str) -> None:
    assert checked_relative_path(path) == normal


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../x", "a/../../x", "", ".", "a\x00b", "d/" * 64 + "f", "d/" * 1000 + "f", "x" * 1025],
    ids=["absolute", "parent", "nested parent", "empty", "dot", "nul", "65 components", "1001 components", "over 1024 bytes"],
)
def test_paths_leaving_the_directory_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="file path"):
        checked_relative_path(path)


SETTINGS = SandboxSettings(default_memory_limit_mb=1024, max_memory_limit_mb=4096, max_run_timeout_s=60)


@pytest.mark.parametrize(
    ("memory", "expected"), [(None, 1024), (-1, 1024), (0, 1024), (300, 300)], ids=["absent uses the default", "-1 uses the default", "0 uses the default", "explicit"]
)
def test_memory_defaults(memory: int | None, expected: int) -> None:
    assert job_from_request(RunCodeRequest(code="x", memory_limit_MB=memory), SETTINGS).memory_limit_mb == expected


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"language": "java"}, "language 'java' is not supported"),
        ({"run_timeout": 61}, "run_timeout 61.0 is over this sandbox's maximum of 60.0 s"),
        ({"memory_limit_MB": 5000}, "memory_limit_MB 5000 is over this sandbox's maximum of 4096"),
        ({"files": {"x": "@@"}}, "files['x']: is not valid base64"),
    ],
    ids=["language", "timeout", "memory", "base64"],
)
def test_invalid_requests_name_the_field(request_fields: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        job_from_request(RunCodeRequest(code="x", **request_fields), SETTINGS)


def test_python3_is_accepted_as_python() -> None:
    assert job_from_request(RunCodeRequest(code="x", language="Python3"), SETTINGS).code == "x"


@pytest.mark.parametrize(
    ("result", "status", "run_status", "return_code"),
    [
        ({"exit_code": 0, "stdout": "1\n", "stderr": "", "execution_time": 0.01}, "Success", "Finished", 0),
        ({"exit_code": 2, "stdout": "", "stderr": "boom", "execution_time": 0.01}, "Failed", "Finished", 2),
        ({"exit_code": None, "signal": 9, "timed_out": True, "stdout": "", "stderr": ""}, "Failed", "TimeLimitExceeded", None),
        ({"worker_died": True, "execution_time": 0.2}, "Failed", "Error", None),
        ({"sandbox_error": "OSError: boom"}, "SandboxError", None, None),
    ],
    ids=["success", "failure", "timeout", "worker died", "sandbox error"],
)
def test_build_response(result: dict, status: str, run_status: str | None, return_code: int | None) -> None:
    response = build_response(result, "pod-1")
    assert response.status == status and response.executor_pod_name == "pod-1"
    assert (response.run_result.status if response.run_result else None) == run_status
    assert (response.run_result.return_code if response.run_result else None) == return_code
    if result.get("worker_died"):
        assert response.message == WORKER_DIED


def test_template_environment_keeps_nothing_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "k")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t")
    env = template_env(SandboxSettings())
    assert "AWS_SECRET_ACCESS_KEY" not in env and "MLFLOW_TRACKING_TOKEN" not in env
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("attempt", "retry_after", "low", "high"),
    [(0, None, 0.0, 0.1), (3, None, 0.0, 0.8), (10, None, 0.0, 2.0), (0, 1.0, 1.0, 1.2), (10, 5.0, 5.0, 6.0)],
    ids=["first retry is short", "grows exponentially", "capped at the maximum", "retry-after is a floor", "retry-after beats the cap"],
)
def test_backoff_delay(attempt: int, retry_after: float | None, low: float, high: float) -> None:
    rng = random.Random(attempt)
    for _ in range(50):
        assert low <= backoff_delay(attempt, base_s=0.1, max_s=2.0, retry_after_s=retry_after, rng=rng) <= high


@pytest.mark.parametrize(("value", "seconds"), [("1", 1.0), ("0.5", 0.5), ("", None), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", None), ("-3", None)])
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETOOL_SANDBOX_WORKERS", "7")
    monkeypatch.setenv("RETOOL_SANDBOX_OUTPUT_LIMIT_BYTES", "4096")
    settings = SandboxSettings()
    assert (settings.workers, settings.output_limit_bytes, settings.effective_queue_size, settings.port) == (7, 4096, 28, 8080)


def test_cli_serve_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from retool.cli import build_parser
    from retool.sandbox.serve import settings_from

    monkeypatch.setenv("RETOOL_SANDBOX_WORKERS", "3")
    monkeypatch.setenv("RETOOL_SANDBOX_MAX_PROCESSES", "9")
    args = build_parser().parse_args(["sandbox", "serve", "--host", "0.0.0.0", "--port", "9000", "--workers", "5"])
    settings = settings_from(args)
    assert (settings.host, settings.port, settings.workers, settings.max_processes) == ("0.0.0.0", 9000, 5, 9)


BOUND_CASES = {
    "ascii": Job(code="print(1+1)\n", run_timeout=5, memory_limit_mb=256),
    "outside the BMP": Job(code="😀" * 1000, run_timeout=5, memory_limit_mb=256, stdin="𝔸" * 10),
    "control characters": Job(code="\x01\x1f" * 500, run_timeout=5, memory_limit_mb=256),
    "quotes and backslashes": Job(code='"\\' * 500, run_timeout=5, memory_limit_mb=256),
    "BMP non-ascii": Job(code="é中" * 700, run_timeout=5, memory_limit_mb=256),
    "empty files and fetches": Job(code="", run_timeout=5, memory_limit_mb=256, files={f"f{i}": None for i in range(300)}, fetch_files=[f"g{i}" for i in range(300)]),
    "file contents": Job(code="x", run_timeout=1e-300, memory_limit_mb=2**40, files={"a/b.txt": "QUJD" * 1000, "\u2028": ""}),
}


@pytest.mark.parametrize("job", BOUND_CASES.values(), ids=BOUND_CASES.keys())
def test_a_jobs_size_bound_is_never_below_its_encoded_size(job: Job) -> None:
    """The pool refuses a job over the worker channel's limit from this bound, encoding it only when
    the bound cannot decide: a bound below the real size would send a message the worker refuses."""
    assert job.encoded_bound() >= len(protocol.encode(job.message(processes_in_use=2**31)))
