"""The code-interpreter tool's schema and config: the one definition every part uses.

The SFT data's ``tools`` column, the RL dataset's prompt-length check, the tool-config YAML the
rollout loads and the tool class itself all take the schema from here, so the model sees the same
tool description in cold-start SFT as in RL. No verl import: ``retool render`` and data
preparation use this without the training stack.
"""

from __future__ import annotations

import copy
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from retool.recipe import verl_plugins

TOOL_NAME = "code_interpreter"
TOOL_CLASS = verl_plugins.TOOL_CLASS

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run Python code in a sandbox and return its stdout and stderr. The value of a trailing bare "
            "expression is printed. numpy, sympy and scipy are available; there is no network access."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


class CodeInterpreterConfig(BaseModel):
    """The tool's ``config`` block in the tool-config YAML; unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["native"] = Field("native", description="verl's tool type; this tool is a native one.")
    sandbox_url: str = Field(..., description="Base URL of the sandbox (SandboxFusion API: POST /run_code).")
    timeout_s: float = Field(30.0, gt=0, le=3600, description="Wall-clock limit of one code execution, seconds.")
    memory_limit_mb: int = Field(1024, ge=16, le=1 << 20, description="Memory limit of one code execution, MiB.")
    max_output_chars: int = Field(4096, ge=200, description="Longest text returned to the model; head and tail are kept around a marker.")
    concurrency: int = Field(16, ge=1, le=4096, description="Executions in flight at once from one agent-loop worker process.")
    retry_deadline_s: float = Field(
        120.0, gt=0, description="Total time one call may spend on the sandbox including retries of 429/503 and connection errors, seconds."
    )

    @field_validator("sandbox_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"sandbox_url must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _deadline_covers_a_run(self) -> CodeInterpreterConfig:
        if self.retry_deadline_s <= self.timeout_s:
            raise ValueError(f"retry_deadline_s ({self.retry_deadline_s:g}) must exceed timeout_s ({self.timeout_s:g}): one run must fit in it")
        return self


def code_interpreter_tool() -> dict[str, Any]:
    """A fresh copy of the schema (callers such as Jinja templates and datasets may mutate it)."""
    return copy.deepcopy(TOOL_SCHEMA)


def render_tool_config(*, sandbox_url: str, timeout_s: float, memory_limit_mb: int, max_output_chars: int, concurrency: int) -> dict[str, Any]:
    """The whole tool-config document verl's ``tool_config_path`` points at (validated, YAML-able).

    Raises pydantic.ValidationError naming the bad field. The retry deadline is four runs, at least
    two minutes: long enough to ride out a sandbox replica restart.
    """
    config = CodeInterpreterConfig(
        sandbox_url=sandbox_url,
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        max_output_chars=max_output_chars,
        concurrency=concurrency,
        retry_deadline_s=max(120.0, 4 * timeout_s),
    )
    return {"tools": [{"class_name": TOOL_CLASS, "config": config.model_dump(), "tool_schema": TOOL_SCHEMA}]}


def tool_config_yaml(**kwargs: Any) -> str:
    return yaml.safe_dump(render_tool_config(**kwargs), sort_keys=False)
