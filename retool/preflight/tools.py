"""The rendered tool config through verl's tool registry, and the run's sandbox through the tool.

``initialize_tools_from_config`` is what verl's tool agent loop calls in every agent-loop worker:
a class path that does not import, a config the tool rejects or a schema the registry cannot
validate fails there, at the first rollout, on GPUs. (verl's RL dataset swallows the same error
with a warning, so data loading alone does not show it.) The sandbox is then called the way a
rollout calls it: the tool's ``create`` / ``execute`` with a snippet whose output is known.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from retool.preflight.checks import CheckResult
from retool.preflight.sft import plain
from retool.recipe.tool.config import TOOL_NAME

logger = logging.getLogger(__name__)


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The schemas verl puts in the prompt (as ``ToolAgentLoop.init_class`` dumps them)."""
    return [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools]


def check_tools(tool_config_path: str, scope: str, sft_tools: list[dict[str, Any]] | None) -> tuple[CheckResult, list[Any]]:
    """``tools``: the registry builds the tools; one is ``code_interpreter``; its schema is the one SFT trained with."""
    from verl.tools.utils.tool_registry import initialize_tools_from_config  # verl 0.6.1's registry (0.9.1: verl.tools.tool_registry)

    try:
        tools = initialize_tools_from_config(tool_config_path)
    except Exception as exc:
        return CheckResult("tools", scope, "failed", f"verl's tool registry could not build the tools of {tool_config_path}: {type(exc).__name__}: {exc}"), []
    names = [tool.name for tool in tools]
    details: dict[str, Any] = {"tool_config": tool_config_path, "tools": names, "classes": [f"{type(t).__module__}.{type(t).__name__}" for t in tools]}
    if TOOL_NAME not in names:
        return CheckResult("tools", scope, "failed", f"the tool config builds {names or 'no tools'}; the recipe's rollouts call {TOOL_NAME!r}", details), tools
    if sft_tools is not None:
        rl = next(s for s in tool_schemas(tools) if s["function"]["name"] == TOOL_NAME)
        sft = next((plain(s) for s in sft_tools if plain(s).get("function", {}).get("name") == TOOL_NAME), None)
        if sft != rl:
            details["sft_schema"], details["rl_schema"] = sft, rl
            return CheckResult("tools", scope, "warning", f"{TOOL_NAME} is described differently in the SFT data than in the RL prompts", details), tools
    return CheckResult("tools", scope, "passed", f"built {', '.join(names)}", details), tools
