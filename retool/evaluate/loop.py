"""The multi-turn code-interpreter loop for one sample, independent of HTTP and of the sandbox.

It mirrors verl's tool agent loop used in training: the model speaks; every tool call it makes
is executed and answered with a ``tool`` message carrying the call's id; this repeats until the
model answers without a tool call or the assistant-turn budget is spent. Tool failures are text
for the model (never exceptions), exactly as in training, so a bad call costs one turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from retool.evaluate.chat import AssistantTurn, ToolCall


class Chat(Protocol):
    async def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], turn_index: int = 0, sample_index: int = 0
    ) -> AssistantTurn: ...


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced: the text the model sees, and whether the code ran cleanly."""

    text: str
    ok: bool
    status: str
    elapsed_s: float = 0.0


class ToolExecutor(Protocol):
    async def __call__(self, call: ToolCall) -> ToolResult: ...


STOP_ANSWERED = "answered"
"""The model answered without calling a tool."""
STOP_MAX_TURNS = "max_turns"
"""The assistant-turn budget ran out while the model still wanted a tool (that last call is not run)."""
STOP_LENGTH = "length"
"""The server stopped the answer at its token limit without a tool call."""


@dataclass
class Transcript:
    """One sample's conversation and the figures the summary aggregates."""

    messages: list[dict[str, Any]]
    prompt_length: int
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    stop: str = STOP_ANSWERED
    tool_seconds: float = 0.0
    elapsed_s: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def response_messages(self) -> list[dict[str, Any]]:
        return self.messages[self.prompt_length :]

    def response_text(self) -> str:
        """The response as training's reward sees it: assistant text, and tool outputs wrapped in
        ``<tool_response>`` as Qwen's chat template renders them (the reward ignores those regions,
        so a ``\\boxed`` printed by code is not taken for the model's answer)."""
        parts = []
        for message in self.response_messages:
            content = str(message.get("content") or "")
            if message.get("role") == "tool":
                parts.append(f"<tool_response>\n{content}\n</tool_response>")
            elif content:
                parts.append(content)
        return "\n".join(parts)

    def final_answer_text(self) -> str:
        """The last assistant message's content (where the boxed answer is expected)."""
        for message in reversed(self.response_messages):
            if message.get("role") == "assistant" and message.get("content"):
                return str(message["content"])
        return ""


async def run_conversation(
    chat: Chat,
    execute: ToolExecutor,
    prompt: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]],
    max_turns: int,
    max_parallel_calls: int = 1,
    sample_index: int = 0,
) -> Transcript:
    """Run one sample to completion, with verl's tool agent loop rules.

    ``max_turns`` bounds assistant turns (``max_assistant_turns``): the turn that reaches it ends
    the conversation even when it asks for a tool, whose call is then not run. Only the first
    ``max_parallel_calls`` calls of a turn run (verl's ``max_parallel_calls``, 1 by default and in
    the RL stage); the others are dropped from the conversation, which must answer every call it
    carries.
    """
    if max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    if max_parallel_calls < 1:
        raise ValueError("max_parallel_calls must be at least 1")
    started = time.monotonic()
    messages = [dict(m) for m in prompt]
    transcript = Transcript(messages=messages, prompt_length=len(messages))
    while True:
        turn = await chat.complete(messages, tools, transcript.turns, sample_index)
        transcript.turns += 1
        for key, value in turn.usage.items():
            transcript.usage[key] = transcript.usage.get(key, 0) + value
        calls = turn.tool_calls[:max_parallel_calls]
        messages.append(turn.message(calls))
        if not calls:
            transcript.stop = STOP_LENGTH if turn.finish_reason == "length" else STOP_ANSWERED
            break
        if transcript.turns >= max_turns:
            transcript.stop = STOP_MAX_TURNS
            break
        # Calls of one turn are independent scripts: run them together, answer in the model's order.
        results = await asyncio.gather(*(execute(call) for call in calls))
        for call, result in zip(calls, results, strict=True):
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
            transcript.tool_calls += 1
            transcript.tool_failures += 0 if result.ok else 1
            transcript.tool_seconds += result.elapsed_s
    transcript.elapsed_s = time.monotonic() - started
    return transcript
