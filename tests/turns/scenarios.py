"""The conversations of the turn-format parity tests, free of verl: both lines' tests use them.

``Turn`` is one assistant turn as the scripted model writes it; ``SCENARIOS`` the multi-turn
conversations every line must keep as one token sequence; ``ScriptedChat`` plays ``retool eval``'s chat
endpoint (vLLM's hermes parser) with the same turns.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retool.data.schema import TOOL_NAME, rl_row
from retool.evaluate.chat import AssistantTurn, ToolCall
from retool.evaluate.loop import run_conversation
from retool.evaluate.tools import sandbox_tool, training_tool_schema
from retool.recipe.turns import token_mismatch


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


LONG_THOUGHT = "<think>\n" + " ".join(f"Step {i}: the sum of the first {i} odd numbers is {i * i}." for i in range(1, 40)) + "\n</think>\n\n"
FINAL = "<think>\nThe interpreter's output settles it.\n</think>\n\n"

SCENARIOS = {
    "a call at token 0": [Turn("", "print(6 * 7)"), Turn(FINAL + "So the product is \\boxed{42}.")],
    "a call after a long thought": [Turn(LONG_THOUGHT + "Let me check it with code.", "x = 2 ** 10\nprint(x)"), Turn(FINAL + "It is \\boxed{1024}.")],
    "several calls, one failing": [
        Turn("First the sum.", "print(sum(range(10)))"),
        Turn("Now a division.", "```python\nprint(1 / 0)\n```"),  # a fenced block, as models often write: the fence is not code
        Turn("That failed; count instead.", "for i in range(3):\n    print(i)"),
        Turn(FINAL + "The answer is \\boxed{45}."),
    ],
}


def thinking(turns: list[Turn]) -> list[Turn]:
    """The turns as Qwen3 writes them in thinking mode: every turn opens with a non-empty ``<think>`` block.

    (Qwen3's template keeps an assistant turn's reasoning in the history only when it is not empty,
    while verl's SFT dataset renders each turn as the conversation's last, where the template writes
    an empty block: with empty reasoning the two differ by design of the template; see docs/recipe.md.)
    """
    return [t if t.text.startswith("<think>") else Turn(f"<think>\nTurn {i}: what next?\n</think>\n\n{t.text or 'Computing.'}", t.code) for i, t in enumerate(turns)]


PROMPT = rl_row(data_source="parity", question="What is the answer?", ground_truth="42", index=0, split="train", source_id=None)["prompt"]


def conversation(turns: list[Turn], tool_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt and the turns as chat messages, each call answered by the tool message verl built for it."""
    assert len(tool_messages) == len(turns) - 1, "every call but the last turn's answer got a tool message"
    messages = [{**m, "tool_calls": None} for m in PROMPT]
    for turn, tool in zip(turns, [*tool_messages, None], strict=True):
        messages.append(turn.message())
        if tool is not None:
            messages.append({"role": "tool", "content": tool["content"], "tool_calls": None})
    return messages


def rendered(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """The chat template's ids (transformers 5 answers a ``BatchEncoding`` where 4.x answered the list)."""
    ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, **kwargs)
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


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


def eval_mismatch(tokenizer: Any, sandbox_url: str, turns: Sequence[Turn], asked: Sequence[Sequence[int]], template: list[int]) -> str | None:
    """``retool eval`` on the same turns against the real sandbox: each request, rendered as vLLM renders it,
    must be the prompt the agent loop sent at that turn (``asked``), and the finished conversation the
    template's ids; the first mismatch described (``token_mismatch``), or None."""
    chat = ScriptedChat(turns)

    async def evaluate() -> Any:
        async with sandbox_tool(sandbox_url, run_timeout_s=10.0, memory_limit_mb=512) as tool:
            return await run_conversation(chat, tool, PROMPT, tools=[training_tool_schema()], max_turns=8)

    transcript = asyncio.run(evaluate())
    eval_tools = [training_tool_schema()]
    if len(chat.requests) != len(asked):
        return f"retool eval sent {len(chat.requests)} requests, the agent loop {len(asked)}"
    for index, (request, prompt) in enumerate(zip(chat.requests, asked, strict=True)):
        sent = rendered(tokenizer, as_vllm_renders(request), eval_tools, add_generation_prompt=True)
        problem = token_mismatch(list(prompt), sent, tokenizer, expected_name=f"agent loop turn {index}", actual_name=f"retool eval turn {index}")
        if problem is not None:
            return problem
    final = rendered(tokenizer, as_vllm_renders(transcript.messages), eval_tools)
    return token_mismatch(template, final, tokenizer, expected_name="apply_chat_template", actual_name="retool eval")
