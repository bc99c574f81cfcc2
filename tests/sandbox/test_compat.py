"""Stock clients work unchanged: the PyPI sandbox-fusion client, and exactly what verl's sandbox tool sends."""

from __future__ import annotations

import base64

import pytest
import sandbox_fusion

from tests.sandbox.conftest import RunningServer

pytestmark = pytest.mark.slow


def test_sandbox_fusion_client_runs_code(server: RunningServer) -> None:
    request = sandbox_fusion.RunCodeRequest(code="import sympy\nprint(sympy.factorint(360))", language="python", run_timeout=5)
    response = sandbox_fusion.run_code(request, endpoint=server.url, max_attempts=1)
    assert response.status == sandbox_fusion.RunStatus.Success
    assert response.run_result.status == sandbox_fusion.CommandRunStatus.Finished
    assert response.run_result.stdout == "{2: 3, 3: 2, 5: 1}\n"
    assert response.run_result.return_code == 0


def test_sandbox_fusion_client_sees_failures_as_failed(server: RunningServer) -> None:
    request = sandbox_fusion.RunCodeRequest(code="print(undefined)", language="python", run_timeout=5)
    response = sandbox_fusion.run_code(request, endpoint=server.url, max_attempts=1)
    assert response.status == sandbox_fusion.RunStatus.Failed
    assert response.run_result.status == sandbox_fusion.CommandRunStatus.Finished and response.run_result.return_code == 1
    assert "NameError" in response.run_result.stderr
    assert sandbox_fusion.summary_run_code_result(response, sandbox_fusion.SummaryMapping(RunFailed="wrong")) == "wrong"


def test_sandbox_fusion_client_files_stdin_and_fetch(server: RunningServer) -> None:
    code = "import sys\nname = sys.stdin.read().strip()\ndata = open('data/in.txt').read()\nopen('out.txt', 'w').write(data.upper() + name)\nprint('ok')"
    request = sandbox_fusion.RunCodeRequest(
        code=code, language="python", stdin="!", files={"data/in.txt": base64.b64encode(b"hello").decode()}, fetch_files=["out.txt", "missing.txt"]
    )
    response = sandbox_fusion.run_code(request, endpoint=server.url, max_attempts=1)
    assert response.status == sandbox_fusion.RunStatus.Success, response
    assert base64.b64decode(response.files["out.txt"]) == b"HELLO!"
    assert "missing.txt" not in response.files


async def test_sandbox_fusion_async_client(server: RunningServer) -> None:
    request = sandbox_fusion.RunCodeRequest(code="print(sum(range(10)))", language="python")
    response = await sandbox_fusion.run_code_async(request, endpoint=server.url, max_attempts=1)
    assert response.status == sandbox_fusion.RunStatus.Success and response.run_result.stdout == "45\n"


@pytest.mark.parametrize(
    ("code", "run_status", "stdout"),
    [
        ("import math\nprint(math.comb(10, 3))", "Finished", "120\n"),
        ("raise ValueError('bad')", "Finished", ""),
        ("while True:\n    pass", "TimeLimitExceeded", ""),
    ],
    ids=["a finished call returns its stdout", "an exception finishes with a failure (so verl shows the traceback)", "a loop hits the time limit"],
)
def test_verl_sandbox_tool_request(server: RunningServer, code: str, run_status: str, stdout: str) -> None:
    """verl 0.6.1's SandboxFusionTool calls _process_single_case -> call_sandbox_api: use them as they are."""
    from verl.utils.reward_score.sandbox_fusion.utils import _process_single_case

    _status, metadata = _process_single_case(0, None, None, f"{server.url}/run_code", code, 1, 256, "python")
    assert metadata["api_status"] == ("Success" if stdout else "Failed"), metadata
    assert metadata["run_status"] == run_status
    assert metadata["stdout"] == stdout
