"""The rendered tool config loads through verl's own tool registry, as the agent loop loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from retool.recipe.render.stages import render_stage
from retool.recipe.tool.config import TOOL_CLASS, TOOL_NAME
from tests.render.cases import context_of, run_of

try:
    from verl.tools.base_tool import BaseTool
except ImportError:  # pragma: no cover - verl is a test dependency
    BaseTool = object  # type: ignore[assignment,misc]


class RecordingTool(BaseTool):  # type: ignore[misc,valid-type]
    """Stands in for the code-interpreter class to check the file format verl reads."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.received = config


def _written_config(tmp_path: Path, class_name: str | None = None) -> Path:
    run = run_of("qwen32b-h200")
    [(_, content)] = render_stage(run, "rl", context_of(run)).files.items()
    doc = yaml.safe_load(content)
    if class_name:
        doc["tools"][0]["class_name"] = class_name
    path = tmp_path / "tool_config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_verl_tool_registry_reads_the_rendered_file(tmp_path: Path) -> None:
    from verl.tools.utils.tool_registry import initialize_tools_from_config

    [tool] = initialize_tools_from_config(str(_written_config(tmp_path, f"{__name__}.RecordingTool")))
    assert isinstance(tool, RecordingTool)
    assert tool.name == TOOL_NAME
    assert tool.tool_schema.function.parameters.required == ["code"]
    assert tool.received["sandbox_url"] == "http://qwen32b-h200-sandbox.retool.svc:8080"
    assert tool.received["max_output_chars"] == 4096


def test_the_real_code_interpreter_tool_accepts_the_rendered_config(tmp_path: Path) -> None:
    from verl.tools.utils.tool_registry import initialize_tools_from_config

    [tool] = initialize_tools_from_config(str(_written_config(tmp_path)))
    assert type(tool).__module__ + "." + type(tool).__name__ == TOOL_CLASS
