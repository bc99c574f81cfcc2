"""Drive our ``RetoolToolAgentLoop`` (verl 0.6.1's ``ToolAgentLoop`` underneath) with a scripted model
and the real sandbox tool, and the evaluation's conversation loop with the same model.

The scripted model writes, turn by turn, exactly what a model trained on the chat template writes:
the text of an assistant message as Qwen's template renders it (content, then the ``<tool_call>``
JSON on its own lines) followed by its end-of-turn token ``<|im_end|>``, where a real model stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, _DummyConfig
from verl.workers.rollout.replica import TokenOutput

from retool.recipe.tool.config import render_tool_config
from retool.recipe.verl_plugins.agent_loop import RetoolToolAgentLoop
from tests.turns.scenarios import Turn


@dataclass
class ScriptedModel:
    """Stands in for the vLLM server behind verl's server manager: the n-th request gets the n-th turn."""

    tokenizer: Any
    turns: Sequence[Turn]
    prompts: list[list[int]] = field(default_factory=list)
    """The prompt ids of every request, in order."""

    def reply_ids(self, index: int) -> list[int]:
        return list(self.tokenizer.encode(self.turns[index].generated() + self.tokenizer.eos_token, add_special_tokens=False))

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any], image_data: Any = None) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        return TokenOutput(token_ids=self.reply_ids(len(self.prompts) - 1), log_probs=None)


def loop_config(tool_config: Path, *, response_length: int = 8192, max_turns: int = 8) -> Any:
    """The parts of verl's trainer config the tool agent loop reads, as the rl stage renders them."""
    multi_turn = {
        "max_user_turns": max_turns,
        "max_assistant_turns": max_turns,
        "max_parallel_calls": 1,
        "max_tool_response_length": 4096,
        "tool_response_truncate_side": "middle",
        "tool_config_path": str(tool_config),
        "format": "hermes",
        "interaction_config_path": None,
    }
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": multi_turn, "prompt_length": 4096, "response_length": response_length}}, "data": {}})


def write_tool_config(path: Path, sandbox_url: str, *, retry_deadline_s: float | None = None) -> Path:
    """The rl stage's tool config; ``retry_deadline_s`` shortens how long a call waits for a sandbox that is down."""
    config = render_tool_config(sandbox_url=sandbox_url, timeout_s=10.0, memory_limit_mb=512, max_output_chars=4096, concurrency=2)
    if retry_deadline_s is not None:
        config["tools"][0]["config"].update(timeout_s=retry_deadline_s / 2, retry_deadline_s=retry_deadline_s)
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class Rollout:
    output: AgentLoopOutput
    tool_messages: list[dict[str, Any]]
    """The tool messages verl appended, as verl built them."""
    tool_schemas: list[dict[str, Any]]
    """The tool schemas verl offered the model (``tools=`` of its prompt)."""
    record: dict[str, Any]

    @property
    def ids(self) -> list[int]:
        return list(self.output.prompt_ids) + list(self.output.response_ids)


def run_agent_loop(tokenizer: Any, config: Any, model: ScriptedModel, prompt: Sequence[Mapping[str, Any]]) -> Rollout:
    """One rollout through our agent loop, in a fresh event loop (verl's class state reset before and after)."""

    async def go() -> Rollout:
        RetoolToolAgentLoop._class_initialized = False
        try:
            loop = RetoolToolAgentLoop(_DummyConfig(config), model, tokenizer, None)
            output = await loop.run({}, raw_prompt=[dict(m) for m in prompt], tools_kwargs={})
            assert loop._agent_data is not None
            tools = [dict(m) for m in loop._agent_data.messages if m["role"] == "tool"]
            return Rollout(output, tools, list(RetoolToolAgentLoop.tool_schemas), output.extra_fields["retool_tools"])
        finally:
            for tool in getattr(RetoolToolAgentLoop, "tools", {}).values():
                await tool.aclose()
            RetoolToolAgentLoop._class_initialized = False

    return asyncio.run(go())
