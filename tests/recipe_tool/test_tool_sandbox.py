"""The tool end to end against the real sandbox server (python -m retool.sandbox on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from retool.embedded.servers import sandbox_server
from retool.recipe.verl_plugins.tool import CodeInterpreterTool
from tests.recipe_tool.helpers import run_then_close

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sandbox_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sandbox_server(tmp_path_factory.mktemp("sandbox"), workers=2) as server:
        yield server.base_url


def _run_all(tool: CodeInterpreterTool, calls: list[object]) -> list[tuple[ToolResponse, float, dict]]:
    async def one_by_one(tool: CodeInterpreterTool) -> list[tuple[ToolResponse, float, dict]]:
        return [await tool.execute("i", parameters) for parameters in calls]  # type: ignore[arg-type]

    return run_then_close(tool, one_by_one)


def _tool(url: str, **overrides: object) -> CodeInterpreterTool:
    return CodeInterpreterTool({"sandbox_url": url, "timeout_s": 5.0, "retry_deadline_s": 30.0, "memory_limit_mb": 256, **overrides}, None)


CASES = [
    ("print", "print(6 * 7)", "42", "ok"),
    ("trailing expression is printed", "x = 6 * 7\nx", "42", "ok"),
    ("fenced block is extracted", "Compute it:\n```python\nimport math\nmath.comb(10, 3)\n```", "120", "ok"),
    ("assignment prints nothing", "x = 1", "(no output; print the values you want to see)", "ok"),
    ("sympy is available", "import sympy as sp\nx = sp.symbols('x')\nsp.solve(x**2 - 4, x)", "[-2, 2]", "ok"),
    (
        "exception keeps the model's frames",
        "import numpy\ndef f():\n    return numpy.linalg.inv([[0, 0], [0, 0]])\nprint('before')\nf()",
        'before\nTraceback (most recent call last):\n  File "main.py", line 5, in <module>\n    f()\n  File "main.py", line 3, in f\n'
        f"    return numpy.linalg.inv([[0, 0], [0, 0]])\n           {'^' * 34}\n  [2 library frames omitted]\n"
        "numpy.linalg.LinAlgError: Singular matrix",
        "code_failed",
    ),
    ("syntax error", "print(\n", "  File \"main.py\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed", "code_failed"),
    ("memory limit", "x = bytearray(2 * 1024**3)\nlen(x)", "MemoryError", "code_failed"),
    ("stderr is returned", "import sys\nprint('out')\nprint('err', file=sys.stderr)", "out\nerr", "ok"),
    (
        "error in a rewritten last line quotes the model's own line",
        "x = [1]\nx[0] + x[5]",
        'Traceback (most recent call last):\n  File "main.py", line 2, in <module>\n    x[0] + x[5]\n           ~^^^\nIndexError: list index out of range',
        "code_failed",
    ),
]


@pytest.mark.parametrize(("code", "expected", "outcome"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tool_runs_code_in_the_real_sandbox(sandbox_url: str, code: str, expected: str, outcome: str) -> None:
    ((response, reward, metrics),) = _run_all(_tool(sandbox_url), [{"code": code}])
    assert reward == 0.0
    assert metrics["outcome"] == outcome
    if outcome == "ok" or "Traceback" in expected or "SyntaxError" in expected:
        assert response.text == expected
    else:
        assert expected in response.text


def test_timeout_keeps_partial_output(sandbox_url: str) -> None:
    ((response, _, metrics),) = _run_all(_tool(sandbox_url, timeout_s=1.0), [{"code": "import time\nprint('started', flush=True)\ntime.sleep(30)"}])
    assert metrics["outcome"] == "timeout"
    assert response.text == "started\nTimeoutError: the code ran longer than the 1 s time limit and was stopped."


def test_huge_output_is_truncated_head_and_tail(sandbox_url: str) -> None:
    ((response, _, _),) = _run_all(_tool(sandbox_url, max_output_chars=1000), [{"code": "for i in range(100000):\n    print(i)"}])
    assert len(response.text) <= 1000
    assert response.text.startswith("0\n1\n2\n") and response.text.endswith("99998\n99999")
    assert "characters truncated" in response.text


def test_verl_agent_loop_call_tool_path(sandbox_url: str) -> None:
    """verl's own ToolAgentLoop._call_tool: json-decodes the call, create -> execute -> release, its truncation."""
    calls = [
        FunctionCall(name="code_interpreter", arguments=json.dumps({"code": "sum(range(101))"})),
        FunctionCall(name="code_interpreter", arguments=json.dumps(["not", "an", "object"])),
        FunctionCall(name="code_interpreter", arguments=json.dumps({"code": None})),
    ]

    async def through_the_loop(tool: CodeInterpreterTool) -> list[tuple[ToolResponse, float, dict]]:
        loop_self = SimpleNamespace(tools={"code_interpreter": tool}, max_tool_response_length=10_000, tool_response_truncate_side="middle")
        return [await ToolAgentLoop._call_tool(loop_self, call, {}) for call in calls]

    (ok, _, _), (not_object, _, _), (null_code, _, _) = run_then_close(_tool(sandbox_url), through_the_loop)
    assert ok.text == "5050"
    assert not_object.text.startswith("Tool error: the arguments must be a JSON object")
    assert null_code.text == 'Tool error: the argument "code" must be a string, got NoneType.'


def test_parallel_calls_share_one_client(sandbox_url: str) -> None:
    results = run_then_close(_tool(sandbox_url, concurrency=4), lambda tool: asyncio.gather(*(tool.execute(str(i), {"code": f"{i} ** 2"}) for i in range(12))))
    assert [r.text for r, _, _ in results] == [str(i**2) for i in range(12)]


def test_busy_sandbox_429_after_retries_becomes_text(tmp_path: Path) -> None:
    """One worker, no queue: while a long run holds it, the server answers 429 until the tool's deadline."""
    with sandbox_server(tmp_path, workers=1, env={"RETOOL_SANDBOX_QUEUE_SIZE": "0"}) as server, httpx.Client(base_url=server.base_url, timeout=60) as blocker:
        url = server.base_url

        async def go() -> tuple[ToolResponse, float, dict]:
            loop = asyncio.get_running_loop()
            hold = loop.run_in_executor(None, lambda: blocker.post("/run_code", json={"code": "import time\ntime.sleep(4.5)", "language": "python", "run_timeout": 6}))
            await asyncio.sleep(1.0)  # let the long run take the only worker
            tool = _tool(url, timeout_s=1.0, retry_deadline_s=2.5)
            try:
                result = await tool.execute("i", {"code": "print(1)"})
            finally:
                await tool.aclose()
            await hold
            return result

        response, _, metrics = asyncio.run(go())
    assert metrics["outcome"] == "overloaded"
    assert response.text.startswith("Sandbox error: the code interpreter is overloaded")
