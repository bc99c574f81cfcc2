"""The tool's config, verl loading, argument handling and failure texts (against scripted real HTTP servers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from verl.tools.schemas import ToolResponse
from verl.tools.utils.tool_registry import initialize_tools_from_config

import retool.recipe.verl_plugins.tool as tool_module
from retool.recipe.verl_plugins.tool import TOOL_SCHEMA, CodeInterpreterConfig, CodeInterpreterTool, render_tool_config
from tests.conftest import free_port
from tests.recipe_tool.helpers import run_then_close
from tests.recipe_tool.scripted_server import Script, scripted_sandbox

TEMPLATE = Path(tool_module.__file__).parents[1] / "tool" / "tool_config.yaml"
RENDER_ARGS = {"sandbox_url": "http://run-sandbox.ns.svc:8080", "timeout_s": 30.0, "memory_limit_mb": 1024, "max_output_chars": 4096, "concurrency": 16}


def _tool(url: str, **overrides: object) -> CodeInterpreterTool:
    config = {"sandbox_url": url, "timeout_s": 5.0, "retry_deadline_s": 6.0, **overrides}
    return CodeInterpreterTool(config, None)


def _execute(tool: CodeInterpreterTool, parameters: object) -> tuple[ToolResponse, float, dict]:
    """One call through the tool's whole life cycle in verl: create, execute, release."""

    async def call(tool: CodeInterpreterTool) -> tuple[ToolResponse, float, dict]:
        instance_id, created = await tool.create()
        assert isinstance(instance_id, str) and created.is_empty()
        result = await tool.execute(instance_id, parameters)  # type: ignore[arg-type]
        assert await tool.release(instance_id) is None
        return result

    return run_then_close(tool, call)


def test_rendered_config_is_loaded_by_verls_own_tool_registry(tmp_path: Path) -> None:
    path = tmp_path / "tool_config.yaml"
    path.write_text(yaml.safe_dump(render_tool_config(**RENDER_ARGS)))
    tools = initialize_tools_from_config(str(path))
    assert len(tools) == 1
    tool = tools[0]
    assert isinstance(tool, CodeInterpreterTool)
    assert tool.name == "code_interpreter"
    assert tool.settings.sandbox_url == RENDER_ARGS["sandbox_url"]
    assert tool.settings.concurrency == 16 and tool.settings.retry_deadline_s == 120.0
    assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == TOOL_SCHEMA


def test_template_is_the_rendered_default_with_the_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETOOL_SANDBOX_URL", RENDER_ARGS["sandbox_url"])
    tools = initialize_tools_from_config(str(TEMPLATE))
    rendered = render_tool_config(**RENDER_ARGS)["tools"][0]
    assert tools[0].settings.model_dump() == rendered["config"]
    assert tools[0].tool_schema.model_dump(exclude_unset=True, exclude_none=True) == rendered["tool_schema"]


def test_schema_has_one_required_string_parameter() -> None:
    function = TOOL_SCHEMA["function"]
    assert function["name"] == "code_interpreter"
    assert function["parameters"]["required"] == ["code"]
    assert function["parameters"]["properties"] == {"code": {"type": "string", "description": "The Python code to run."}}


BAD_CONFIGS = [
    ("missing url", {}, "sandbox_url"),
    ("url without scheme", {"sandbox_url": "sandbox:8080"}, "sandbox_url"),
    ("zero timeout", {"sandbox_url": "http://s", "timeout_s": 0}, "timeout_s"),
    ("tiny memory", {"sandbox_url": "http://s", "memory_limit_mb": 1}, "memory_limit_mb"),
    ("zero concurrency", {"sandbox_url": "http://s", "concurrency": 0}, "concurrency"),
    ("tiny output", {"sandbox_url": "http://s", "max_output_chars": 10}, "max_output_chars"),
    ("deadline shorter than a run", {"sandbox_url": "http://s", "timeout_s": 30, "retry_deadline_s": 10}, "retry_deadline_s"),
    ("unknown key", {"sandbox_url": "http://s", "timeout": 30}, "timeout"),
    ("wrong tool type", {"sandbox_url": "http://s", "type": "mcp"}, "type"),
]


@pytest.mark.parametrize(("config", "field"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_rejected_at_construction(config: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        CodeInterpreterTool(config, None)


def test_render_rejects_bad_values() -> None:
    with pytest.raises(ValidationError, match="concurrency"):
        render_tool_config(**{**RENDER_ARGS, "concurrency": 0})


def test_config_defaults_match_the_spec_defaults() -> None:
    config = CodeInterpreterConfig(sandbox_url="http://s/")
    assert (config.sandbox_url, config.timeout_s, config.memory_limit_mb) == ("http://s", 30.0, 1024)


BAD_ARGUMENTS = [
    ("arguments are a list", ["print(1)"], 'must be a JSON object like {"code": "print(1 + 1)"}, got list'),
    ("arguments are a string", "print(1)", "got str"),
    ("arguments are null", None, "got NoneType"),
    ("code is missing", {"source": "print(1)"}, 'missing the required argument "code"'),
    ("code is a number", {"code": 12}, 'the argument "code" must be a string, got int'),
    ("code is a list", {"code": ["print(1)"]}, "got list"),
    ("code is blank", {"code": "  \n"}, 'the argument "code" is empty'),
]


@pytest.mark.parametrize(("parameters", "message"), [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS])
def test_bad_arguments_become_text_without_calling_the_sandbox(parameters: object, message: str) -> None:
    script = Script()
    with scripted_sandbox(script) as url:
        response, reward, metrics = _execute(_tool(url), parameters)
    assert message in (response.text or "")
    assert response.text.startswith("Tool error:")
    assert (reward, metrics["outcome"]) == (0.0, "bad_arguments")
    assert script.requests == []


def test_unreachable_sandbox_becomes_text() -> None:
    response, _, metrics = _execute(_tool(f"http://127.0.0.1:{free_port()}", timeout_s=0.5, retry_deadline_s=1.0), {"code": "print(1)"})
    assert response.text.startswith("Sandbox error: the code interpreter is unreachable")
    assert metrics["outcome"] == "unavailable"


def test_429_after_retries_becomes_text() -> None:
    script = Script(status=429, body='{"detail": "busy"}', headers={"retry-after": "0.1"})
    with scripted_sandbox(script) as url:
        response, _, metrics = _execute(_tool(url, timeout_s=0.5, retry_deadline_s=1.5), {"code": "print(1)"})
    assert response.text.startswith("Sandbox error: the code interpreter is overloaded")
    assert metrics["outcome"] == "overloaded"
    assert len(script.requests) >= 2, "429s are retried until the deadline"


FAULTS = [
    ("request rejected with 400", Script(status=400, body='{"detail": "language cobol is not served"}'), "language cobol is not served", "sandbox_error"),
    ("200 with a body that is not JSON", Script(status=200, body="<html>proxy</html>"), "not a RunCodeResponse", "sandbox_error"),
    (
        "sandbox-side error answer",
        Script(body=json.dumps({"status": "SandboxError", "message": "worker crashed", "run_result": None})),
        "Sandbox error: worker crashed",
        "sandbox_error",
    ),
]


@pytest.mark.parametrize(("script", "text", "outcome"), [c[1:] for c in FAULTS], ids=[c[0] for c in FAULTS])
def test_sandbox_faults_become_text(script: Script, text: str, outcome: str) -> None:
    with scripted_sandbox(script) as url:
        response, _, metrics = _execute(_tool(url), {"code": "print(1)"})
    assert text in response.text
    assert metrics["outcome"] == outcome


def test_request_carries_the_configured_limits_and_the_rewritten_code() -> None:
    script = Script()
    with scripted_sandbox(script) as url:
        response, _, _ = _execute(_tool(url, timeout_s=7.5, retry_deadline_s=10.0, memory_limit_mb=256), {"code": "```python\nx = 3\nx\n```"})
    (request,) = script.requests
    assert request["run_timeout"] == 7.5 and request["memory_limit_MB"] == 256 and request["language"] == "python"
    assert request["code"].startswith("x = 3\n_retool_last_value = (x)")
    assert response.text.startswith("ran ")


def test_concurrency_is_limited_per_tool() -> None:
    script = Script(delay_s=0.2)
    with scripted_sandbox(script) as url:
        results = run_then_close(_tool(url, concurrency=2), lambda tool: asyncio.gather(*(tool.execute(str(i), {"code": f"print({i})"}) for i in range(6))))
    assert [m["outcome"] for _, _, m in results] == ["ok"] * 6
    assert script.peak_in_flight == 2
    assert len(script.requests) == 6


def test_long_output_is_truncated_to_the_configured_length() -> None:
    stdout = "".join(f"line {i}\n" for i in range(5000))
    body = json.dumps({"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": stdout, "stderr": ""}})
    with scripted_sandbox(Script(body=body)) as url:
        response, _, _ = _execute(_tool(url, max_output_chars=500), {"code": "print(1)"})
    assert len(response.text) <= 500
    assert response.text.startswith("line 0\n") and response.text.endswith("line 4999")
    assert "characters truncated" in response.text


@pytest.mark.parametrize(
    ("script", "status"),
    [(None, "unavailable"), (Script(status=429, body='{"detail": "busy"}', headers={"retry-after": "0.1"}), "overloaded")],
    ids=["unreachable", "overloaded"],
)
def test_retool_eval_shows_the_model_the_same_sandbox_failure_text_as_training(script: Script | None, status: str) -> None:
    """An evaluated model must meet the words it was trained on when the sandbox does not answer."""
    import asyncio

    from retool.evaluate.tools import SandboxTool
    from retool.sandbox.client import SandboxClient

    async def eval_text(url: str) -> tuple[str, str]:
        async with SandboxClient(url, deadline_s=1.5) as client:
            result = await SandboxTool(client, run_timeout_s=0.5).run("print(1)")
        return result.text, result.status

    def both(url: str) -> tuple[tuple[str, str], tuple[str, str]]:
        response, _, metrics = _execute(_tool(url, timeout_s=0.5, retry_deadline_s=1.5), {"code": "print(1)"})
        return (response.text, metrics["outcome"]), asyncio.run(eval_text(url))

    if script is None:
        training, evaluation = both(f"http://127.0.0.1:{free_port()}")
    else:
        with scripted_sandbox(script) as url:
            training, evaluation = both(url)
    assert training == evaluation
    assert training[1] == status and "try again" in training[0]
