"""Drive our ``RetoolToolAgentLoop`` (verl 0.6.1's ``ToolAgentLoop`` underneath) with a scripted model
and the real sandbox tool, and the evaluation's conversation loop with the same model.

The scripted model writes, turn by turn, exactly what a model trained on the chat template writes:
the text of an assistant message as Qwen's template renders it (content, then the ``<tool_call>``
JSON on its own lines) followed by its end-of-turn token ``<|im_end|>``, where a real model stops.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, _DummyConfig
from verl.workers.rollout.replica import TokenOutput

from retool.data.schema import TOOL_NAME
from retool.evaluate.chat import AssistantTurn, ToolCall
from retool.recipe.tool.config import render_tool_config
from retool.recipe.verl_plugins.agent_loop import RetoolToolAgentLoop


@dataclass(frozen=True)
class Turn:
    """One assistant turn: what the model writes before its call (or its whole answer), and the call's code."""

    text: str
    code: str | None = None

    def generated(self) -> str:
        """The turn's text as the model generates it, in the template's layout."""
        if self.code is None:
            return self.text
        call = "<tool_call>\n" + json.dumps({"name": TOOL_NAME, "arguments": {"code": self.code}}) + "\n</tool_call>"
        return f"{self.text}\n{call}" if self.text else call

    def message(self) -> dict[str, Any]:
        """The same turn as a chat message (the SFT data's layout: arguments an object)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "tool_calls": None}
        if self.code is not None:
            message["tool_calls"] = [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": self.code}}}]
        return message


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


def write_tool_config(path: Path, sandbox_url: str) -> Path:
    path.write_text(yaml.safe_dump(render_tool_config(sandbox_url=sandbox_url, timeout_s=10.0, memory_limit_mb=512, max_output_chars=4096, concurrency=2)))
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


CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_split(text: str, turn_index: int) -> AssistantTurn:
    """A generated turn as vLLM's OpenAI server returns it with ``--tool-call-parser hermes``
    (vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py, ``extract_tool_calls``): the content is
    the text before the first ``<tool_call>``, each call's arguments re-serialised with ``json.dumps``."""
    calls = [json.loads(m) for m in CALL.findall(text)]
    if not calls:
        return AssistantTurn(content=text, tool_calls=(), finish_reason="stop")
    content = text[: text.find("<tool_call>")]
    tool_calls = tuple(ToolCall(id=f"call_{turn_index}_{i}", name=c["name"], arguments=json.dumps(c["arguments"], ensure_ascii=False)) for i, c in enumerate(calls))
    return AssistantTurn(content=content, tool_calls=tool_calls, finish_reason="tool_calls")


@dataclass
class ScriptedChat:
    """The evaluation's chat endpoint played by the same scripted model; keeps every request's messages."""

    turns: Sequence[Turn]
    requests: list[list[dict[str, Any]]] = field(default_factory=list)

    async def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], turn_index: int = 0, sample_index: int = 0) -> AssistantTurn:
        self.requests.append(json.loads(json.dumps(list(messages))))
        return hermes_split(self.turns[turn_index].generated(), turn_index)


def as_vllm_renders(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to the chat template: tool-call arguments parsed from their JSON
    string into an object (vllm/entrypoints/chat_utils.py, ``_postprocess_messages``)."""
    rendered = json.loads(json.dumps(list(messages)))
    for message in rendered:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return rendered
