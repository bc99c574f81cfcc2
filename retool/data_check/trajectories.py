"""SFT trajectories as (code, recorded output) steps plus the final answer, from either layout.

Two layouts are read:
- ReTool-SFT as published: ``messages`` = [user, assistant]; the assistant text interleaves
  reasoning with ``<code>```python ...```</code>``, ``<interpreter>...</interpreter>`` and a final
  ``<answer>...</answer>``; the user text holds the question after ``*user question:*``.
- multi-turn (what ``retool data prepare sft`` writes): assistant messages carrying
  ``tool_calls`` to ``code_interpreter`` with ``arguments`` {"code": ...} (a dict or a JSON
  string), each answered by a ``tool`` message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
INTERPRETER_OPEN, INTERPRETER_CLOSE = "<interpreter>", "</interpreter>"
QUESTION_MARKER = "*user question:*"
FENCED = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
SEGMENT = re.compile(r"<code>(.*?)</code>\s*(?:<interpreter>(.*?)</interpreter>)?", re.DOTALL)


class TrajectoryError(ValueError):
    """A row is not an SFT trajectory in either layout (the message says what is missing)."""


@dataclass(frozen=True)
class CodeStep:
    code: str
    recorded: str | None
    """The interpreter output recorded in the data; None when no output follows the code."""


@dataclass(frozen=True)
class Trajectory:
    index: int
    question: str
    steps: tuple[CodeStep, ...]
    final_text: str
    """The model's own text after its last tool output: where its final answer is."""
    ground_truth: str | None


def fenced_code(text: str) -> str:
    """The first fenced python block of a ``<code>`` section, or the section itself."""
    match = FENCED.search(text)
    return (match.group(1) if match else text).strip("\n")


def _ground_truth(row: Mapping[str, Any]) -> str | None:
    reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), Mapping) else {}
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    for value in (reward_model.get("ground_truth"), row.get("answer"), row.get("ground_truth"), extra.get("answer"), extra.get("ground_truth")):
        if value is not None and str(value).strip():
            return str(value).strip()
    return None


def _question(content: str) -> str:
    position = content.find(QUESTION_MARKER)
    return (content[position + len(QUESTION_MARKER) :] if position >= 0 else content).strip()


def parse_interleaved(text: str) -> tuple[list[CodeStep], str]:
    """Steps and final text of a single assistant message in the published ReTool-SFT layout."""
    matches = list(SEGMENT.finditer(text))
    steps = [CodeStep(code=fenced_code(m.group(1)), recorded=None if m.group(2) is None else m.group(2).strip("\n")) for m in matches]
    final_text = text[matches[-1].end() :] if matches else text
    return steps, final_text.strip()


def _arguments(raw: Any, where: str) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"{where}: arguments are not JSON: {exc}") from exc
        if isinstance(parsed, Mapping):
            return parsed
    raise TrajectoryError(f"{where}: arguments must be an object with 'code'")


def parse_multi_turn(messages: Sequence[Mapping[str, Any]]) -> tuple[list[CodeStep], str]:
    """Steps and final text of a conversation whose assistant turns carry ``tool_calls``."""
    steps: list[CodeStep] = []
    pending: list[tuple[str | None, str]] = []  # (call id, code) awaiting their tool messages
    answered: dict[int, str] = {}
    final_text = ""
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls") or []
            for number, call in enumerate(calls):
                function = call.get("function", {}) if isinstance(call, Mapping) else {}
                arguments = _arguments(function.get("arguments"), f"messages[{position}].tool_calls[{number}]")
                code = arguments.get("code")
                if not isinstance(code, str):
                    raise TrajectoryError(f"messages[{position}].tool_calls[{number}]: 'code' must be a string")
                pending.append((call.get("id"), fenced_code(code)))
                steps.append(CodeStep(code=fenced_code(code), recorded=None))
            if not calls and message.get("content"):
                final_text = str(message["content"])
        elif role == "tool":
            step_index = _match_tool_message(message, pending, steps, answered)
            if step_index is not None:
                answered[step_index] = str(message.get("content") or "").strip("\n")
    resolved = [CodeStep(code=s.code, recorded=answered.get(i)) for i, s in enumerate(steps)]
    return resolved, final_text.strip()


def _match_tool_message(message: Mapping[str, Any], pending: list[tuple[str | None, str]], steps: list[CodeStep], answered: dict[int, str]) -> int | None:
    """The step a tool message answers: by ``tool_call_id`` when both sides have ids, else the oldest unanswered call."""
    call_id = message.get("tool_call_id")
    if call_id is not None:
        for index, (pending_id, _) in enumerate(pending):
            if pending_id == call_id and index not in answered:
                return index
    for index in range(len(steps)):
        if index not in answered:
            return index
    return None


def parse_trajectory(row: Mapping[str, Any], index: int) -> Trajectory:
    """One data row as a Trajectory, whichever layout it uses."""
    messages = row.get("messages") if isinstance(row, Mapping) else None
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise TrajectoryError(f"row {index}: missing 'messages' (a list of chat messages)")
    messages = [m for m in messages if isinstance(m, Mapping)]
    users = [m for m in messages if m.get("role") == "user"]
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if not users or not assistants:
        raise TrajectoryError(f"row {index}: needs a user and an assistant message")
    question = _question(str(users[0].get("content") or ""))
    multi_turn = any(m.get("tool_calls") for m in assistants) or any(m.get("role") == "tool" for m in messages)
    try:
        if multi_turn:
            steps, final_text = parse_multi_turn(messages)
        else:
            steps, final_text = parse_interleaved("\n".join(str(m.get("content") or "") for m in assistants))
    except TrajectoryError as exc:
        raise TrajectoryError(f"row {index}: {exc}") from exc
    return Trajectory(index=index, question=question, steps=tuple(steps), final_text=final_text, ground_truth=_ground_truth(row))
