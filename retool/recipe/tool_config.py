"""The code-interpreter tool config the RL rollout loads (``multi_turn.tool_config_path``).

LEAD: ``retool.recipe.tool.render_tool_config`` (branch ``reward``) owns this format; once it
lands, replace the body of :func:`tool_config` with a call to it (same signature) and delete
:func:`render_tool_config` here. Until then this builds the layout verl's tool registry reads
(``verl.tools.utils.tool_registry.initialize_tools_from_config``): a ``tools`` list of
``class_name`` + ``config`` (``type: native``) + an OpenAI function ``tool_schema``.
"""

from __future__ import annotations

from typing import Any

import yaml

TOOL_CLASS = "retool.recipe.tool.CodeInterpreterTool"
TOOL_NAME = "code_interpreter"


def render_tool_config(*, sandbox_url: str, timeout_s: float, memory_limit_mb: int, max_output_chars: int, concurrency: int) -> dict[str, Any]:
    """The tool config as a dict (interim copy of the ``reward`` helper's function, same signature)."""
    return {
        "tools": [
            {
                "class_name": TOOL_CLASS,
                "config": {
                    "type": "native",
                    "sandbox_url": sandbox_url,
                    "timeout_s": timeout_s,
                    "memory_limit_mb": memory_limit_mb,
                    "max_output_chars": max_output_chars,
                    "concurrency": concurrency,
                },
                "tool_schema": {
                    "type": "function",
                    "function": {
                        "name": TOOL_NAME,
                        "description": "Run Python code in a sandbox and return what it prints; the value of a trailing bare expression is printed too.",
                        "parameters": {
                            "type": "object",
                            "properties": {"code": {"type": "string", "description": "The Python code to execute."}},
                            "required": ["code"],
                        },
                    },
                },
            }
        ]
    }


def tool_config(**kwargs: Any) -> dict[str, Any]:
    """The one call site the renderers use (switch point for the lead, see the module docstring)."""
    return render_tool_config(**kwargs)


def tool_config_yaml(**kwargs: Any) -> str:
    return yaml.safe_dump(tool_config(**kwargs), sort_keys=False)
