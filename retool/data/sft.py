"""ReTool-SFT -> multi-turn tool-calling conversations for verl's ``MultiTurnSFTDataset``.

ReTool-SFT stores each trajectory as one assistant text in which reasoning alternates with
``<code>...</code>``, the sandbox's ``<interpreter>...</interpreter>`` output and a final
``<answer>...</answer>``. verl trains multi-turn data per message: assistant turns are learned,
tool turns are masked out of the loss. So the text is split into assistant turns that call
``code_interpreter`` with ``{"code": ...}``, tool turns holding the interpreter output, and the final
assistant answer; without that split the interpreter output would be trained on as if the model
had written it. Data that is already multi-turn is validated and normalised to the same layout.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from retool.data.conversion import converting
from retool.data.report import MalformedRowError, PrepareSummary, limit_counter, reached
from retool.data.schema import ANSWER_INSTRUCTION, SFT_SCHEMA, TOOL_NAME, code_interpreter_tool
from retool.data.sources import BadLine, RowBatch
from retool.data.writer import DEFAULT_MAX_MALFORMED_FRACTION, AtomicParquetWriter

logger = logging.getLogger(__name__)

DEFAULT_DATA_SOURCE = "retool_sft"
ROLES = ("system", "user", "assistant", "tool")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN_FENCE = re.compile(r"^\s*```[ \t]*(?:python3?|py)?[ \t]*\r?\n", re.IGNORECASE)
_INTERPRETER = re.compile(r"\s*<interpreter>(.*?)</interpreter>", re.DOTALL)
CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
# ReTool-SFT prompts wrap the question in instructions for the <code>/<interpreter> text protocol:
# "... Each code snippet is wrapped with `<code>...`... *user question:*\n{question}\n\nRemember to place
# the final answer in the last part using the format: <answer>...". Once code becomes tool calls those
# instructions contradict what the model is trained to emit, so the question is re-wrapped with the
# same single ANSWER_INSTRUCTION the RL and eval prompts carry.
_QUESTION_MARKER = re.compile(r"\*{1,2}\s*user question:?\s*\*{1,2}:?", re.IGNORECASE)
_RETOOL_REMINDER = re.compile(r"\s*Remember to place the final answer in the last part.*$", re.IGNORECASE | re.DOTALL)


def extract_code(block: str) -> str:
    """The code of a ``<code>`` block: its first fenced block if it has one, else the block itself.

    >>> extract_code("\\n```python\\nprint(1)\\n```\\n")
    'print(1)'
    """
    fenced = _FENCE.search(block)
    if fenced:
        return fenced.group(1).strip("\n").rstrip()
    return _OPEN_FENCE.sub("", block).replace("```", "").strip("\n").rstrip()


def retool_question(content: str) -> str | None:
    """The bare question of a ReTool-SFT prompt, or None when the prompt is not in that format.

    >>> retool_question("Solve ... wrapped with `<code>`.\\n\\n*user question:*\\nWhat is 2+2?\\n\\nRemember to place the final answer in the last part ...")
    'What is 2+2?'
    """
    markers = list(_QUESTION_MARKER.finditer(content))
    if not markers:
        return None
    question = _RETOOL_REMINDER.sub("", content[markers[-1].end() :]).strip()
    return question or None


def rewrite_prompt(content: str) -> tuple[str, bool]:
    """A ReTool-SFT prompt re-wrapped as question + ANSWER_INSTRUCTION; other prompts unchanged."""
    question = retool_question(content)
    if question is None:
        return content, False
    return f"{question}\n\n{ANSWER_INSTRUCTION}", True


def tool_call(code: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}


def assistant(content: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": calls}


def split_trajectory(text: str) -> list[dict[str, Any]]:
    """Split one ReTool assistant text into assistant / tool / ... / final assistant messages.

    Raises ``MalformedRowError`` for an unclosed ``<code>``, a code block without interpreter output,
    interpreter output without code, an empty code block, or a missing final answer.
    """
    messages: list[dict[str, Any]] = []
    position = 0
    while True:
        start = text.find(CODE_OPEN, position)
        if start == -1:
            break
        end = text.find(CODE_CLOSE, start)
        if end == -1:
            raise MalformedRowError("unclosed <code> block")
        before = text[position:start]
        if "<interpreter>" in before:
            raise MalformedRowError("interpreter output without a preceding code block")
        code = extract_code(text[start + len(CODE_OPEN) : end])
        if not code.strip():
            raise MalformedRowError("empty code block")
        after = end + len(CODE_CLOSE)
        output = _INTERPRETER.match(text, after)
        if output is None:
            raise MalformedRowError("code block without interpreter output")
        messages.append(assistant(before.strip(), [tool_call(code)]))
        messages.append({"role": "tool", "content": output.group(1).strip("\n"), "tool_calls": None})
        position = output.end()
    final = text[position:]
    if "<interpreter>" in final:
        raise MalformedRowError("interpreter output without a preceding code block")
    if CODE_CLOSE in final:
        raise MalformedRowError("stray </code>")
    if "<answer>" not in final and "\\boxed" not in final:
        raise MalformedRowError("no final <answer> after the last tool output")
    messages.append(assistant(final.strip()))
    return messages


def parse_arguments(raw: Any) -> dict[str, str]:
    """Tool-call arguments as the ``{"code": str}`` dict chat templates render with ``tojson``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MalformedRowError(f"tool call arguments are not valid JSON: {exc.msg}") from exc
    if not isinstance(raw, Mapping):
        raise MalformedRowError("tool call arguments are not an object")
    extra = sorted(k for k, v in raw.items() if k != "code" and v is not None)
    if extra:
        raise MalformedRowError(f"tool call arguments other than code: {', '.join(extra)}")
    code = raw.get("code")
    if not isinstance(code, str) or not code.strip():
        raise MalformedRowError("tool call without a code string")
    return {"code": code}


def normalize_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise MalformedRowError("tool call is not an object")
    function = call.get("function")
    if not isinstance(function, Mapping):
        raise MalformedRowError("tool call without a function")
    if function.get("name") != TOOL_NAME:
        raise MalformedRowError(f"tool call to {function.get('name')!r}, not {TOOL_NAME}")
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": parse_arguments(function.get("arguments"))}}


def normalize_conversation(messages: list[Any]) -> list[dict[str, Any]]:
    """Validate already multi-turn messages and rewrite them in the output layout."""
    out: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise MalformedRowError(f"message {position} is not an object")
        role = message.get("role")
        if role not in ROLES:
            raise MalformedRowError(f"message {position} has role {role!r}")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise MalformedRowError(f"message {position} content is not text")
        calls = message.get("tool_calls") or None
        if calls is not None and role != "assistant":
            raise MalformedRowError(f"message {position} ({role}) carries tool calls")
        if calls is not None and len(calls) > 1:
            # verl's SFT dataset hands templates numpy arrays; Qwen's "not message.tool_calls" fails on two or more.
            raise MalformedRowError(f"message {position} has {len(calls)} tool calls in one turn (one per turn is supported)")
        if role == "system" and position != 0:
            raise MalformedRowError("system message is not the first message")
        if role == "tool" and not (out and (out[-1]["role"] == "tool" or out[-1]["tool_calls"])):
            raise MalformedRowError(f"tool message {position} does not follow a tool call")
        out.append({"role": role, "content": content, "tool_calls": [normalize_call(c) for c in calls] if calls else None})
    first = 1 if out and out[0]["role"] == "system" else 0
    if len(out) <= first or out[first]["role"] != "user":
        raise MalformedRowError("conversation does not start with a user message")
    if len(out) < first + 2 or out[first + 1]["role"] != "assistant":
        raise MalformedRowError("user message is not followed by an assistant message")
    if out[-1]["role"] != "assistant" or out[-1]["tool_calls"]:
        raise MalformedRowError("conversation does not end with an assistant answer")
    return out


class Converted(NamedTuple):
    row: dict[str, Any]
    how: str
    """``split`` (from ReTool's tags) or ``multi_turn`` (given as turns)."""
    prompt_rewritten: bool


def convert_sft_row(row: Any, data_source: str = DEFAULT_DATA_SOURCE, rewrite_prompts: bool = True) -> Converted:
    """One output row, and how it was obtained.

    With ``rewrite_prompts``, ReTool-format user prompts become question + ANSWER_INSTRUCTION."""
    if isinstance(row, BadLine):
        raise MalformedRowError(row.reason)
    if not isinstance(row, Mapping):
        raise MalformedRowError(f"row is a {type(row).__name__}, not an object")
    messages = row.get("messages")
    if not isinstance(messages, list | tuple) or not messages:
        raise MalformedRowError("missing or empty messages")
    conversation = normalize_conversation(list(messages))
    assistants = [m for m in conversation if m["role"] == "assistant"]
    tagged = len(assistants) == 1 and not assistants[0]["tool_calls"] and conversation[-1] is assistants[0]
    how = "multi_turn"
    if tagged:
        conversation = conversation[:-1] + split_trajectory(assistants[0]["content"])
        how = "split"
    rewritten = False
    if rewrite_prompts:
        for message in conversation:
            if message["role"] == "user":
                message["content"], changed = rewrite_prompt(message["content"])
                rewritten |= changed
    return Converted({"messages": conversation, "tools": [code_interpreter_tool()], "data_source": row.get("data_source") or data_source}, how, rewritten)


def prepare_sft(
    source: str,
    out: str,
    *,
    split: str = "train",
    data_source: str = DEFAULT_DATA_SOURCE,
    rewrite_prompts: bool = True,
    max_rows: int | None = None,
    batches: Iterable[RowBatch] | None = None,
    max_malformed_fraction: float = DEFAULT_MAX_MALFORMED_FRACTION,
    staged: list[AtomicParquetWriter] | None = None,
    **source_options: Any,
) -> PrepareSummary:
    """Convert ReTool-SFT (or multi-turn) rows from ``source`` into ``out``; return and log the summary.

    ``rewrite_prompts=False`` keeps ReTool's original user prompts (with their <code>-tag instructions);
    ``max_rows`` stops reading once that many rows are written (smoke tests)."""
    counters: Counter[str] = Counter()
    with converting(
        "sft", source, out, SFT_SCHEMA, split=split, batches=batches, batch_rows=1024, flush_rows=512,
        max_malformed_fraction=max_malformed_fraction, staged=staged, source_options=source_options,
    ) as (summary, log, writer, batches):  # fmt: skip
        for batch in batches:
            if reached(max_rows, counters["written"]):
                break
            summary.rows_read += len(batch)
            for offset, row in enumerate(batch.to_rows()):
                if reached(max_rows, counters["written"]):
                    break
                try:
                    converted = convert_sft_row(row, data_source, rewrite_prompts)
                except MalformedRowError as exc:
                    log.add(batch.where(offset), str(exc), row)
                    continue
                counters[converted.how] += 1
                counters["prompts_rewritten"] += converted.prompt_rewritten
                counters["tool_calls"] += sum(1 for m in converted.row["messages"] if m["tool_calls"])
                writer.write(converted.row)
                counters["written"] += 1
        summary.counters = {
            "converted_from_tags": counters["split"],
            "already_multi_turn": counters["multi_turn"],
            "tool_calls": counters["tool_calls"],
            "prompts_rewritten": counters["prompts_rewritten"],
            **limit_counter(max_rows, counters["written"]),
        }
    return summary
