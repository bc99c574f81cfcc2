"""The scripted model's turns, tokenized by verl's SFT dataset exactly as cold-start SFT trains them.

A scripted episode is a conversation in the layout ``retool data prepare`` writes for SFT (``messages``
with ``code_interpreter`` tool calls, ``tools``): the user's problem, an assistant turn that calls the
interpreter, the interpreter's output, and an assistant turn with the answer read from that output.
It goes through verl's multi-turn SFT dataset with the run's SFT data config, and the tokens verl
trains on (the loss-masked spans) are what the scripted server replays. So the rollout check
exercises the tool-call format SFT teaches against the parser RL uses (``multi_turn.format``)
with the run's real chat template, instead of a tool-call string written by hand.

A text-only run (``spec.recipe: text-only``) has no tool: its episode is the problem and one
assistant turn with the boxed answer, without a tool schema, tokenized the same way (so the reply
carries whatever the chat template puts around an assistant turn, e.g. Qwen3's empty thinking).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from retool.data.schema import SFT_SCHEMA, TOOL_NAME, code_interpreter_tool
from retool.preflight.scripted import Episode

OUTPUT_LABEL = "preflight result"

MISSING_OUTPUT_TEXT = "The interpreter did not print the expected output, so I cannot give an answer."


def tool_code(ground_truth: str) -> str:
    """Code whose output (``preflight result: <answer>``) appears nowhere in the code itself, so the
    tool's output can be told apart from the model's own tokens."""
    return f'label = "result"\nanswer = {ground_truth!r}\nprint(f"preflight {{label}}: {{answer}}")'


def expected_output(ground_truth: str) -> str:
    return f"{OUTPUT_LABEL}: {ground_truth}"


def conversation(question: str, ground_truth: str) -> list[dict[str, Any]]:
    """The scripted trajectory, in the SFT layout of ``retool.data.schema`` (tool arguments as a struct)."""
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": tool_code(ground_truth)}}}
    return [
        {"role": "user", "content": question, "tool_calls": None},
        {"role": "assistant", "content": "I will check the answer with the code interpreter.", "tool_calls": [call]},
        {"role": "tool", "content": expected_output(ground_truth), "tool_calls": None},
        {"role": "assistant", "content": f"The interpreter printed {ground_truth}, so the final answer is \\boxed{{{ground_truth}}}.", "tool_calls": None},
    ]


def text_conversation(question: str, ground_truth: str) -> list[dict[str, Any]]:
    """The scripted trajectory of a text-only run: the problem and one answer, no tool."""
    return [
        {"role": "user", "content": question, "tool_calls": None},
        {"role": "assistant", "content": f"Working it out step by step, the final answer is \\boxed{{{ground_truth}}}.", "tool_calls": None},
    ]


def write_conversations(path: Path, problems: Sequence[tuple[str, str]], tools: list[dict[str, Any]] | None = None, *, with_tool: bool = True) -> Path:
    """One SFT row per (question, ground truth), with ``tools`` (default: the built-in schema); with
    ``with_tool=False`` the text-only conversation, without a tools column."""
    if with_tool:
        rows = [{"messages": conversation(q, gt), "tools": tools or [code_interpreter_tool()], "data_source": "preflight"} for q, gt in problems]
    else:
        rows = [{"messages": text_conversation(q, gt), "tools": None, "data_source": "preflight"} for q, gt in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SFT_SCHEMA)
    if not with_tool:
        # No tools column at all: verl 0.9.1's SFT dataset reads parquet with dtype_backend="pyarrow",
        # so a null becomes pd.NA, which the chat template cannot take as ``tools`` (0.6.1 reads None).
        table = table.drop(["tools"])
    pq.write_table(table, path)
    return path


def trained_spans(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[list[int]]:
    """Maximal runs of tokens with loss: what SFT teaches the model to emit, one run per assistant turn."""
    spans: list[list[int]] = []
    previous = 0
    for token, mask in zip(input_ids, loss_mask, strict=True):
        if mask and not previous:
            spans.append([])
        if mask:
            spans[-1].append(int(token))
        previous = mask
    return spans


def through_end_of_turn(tokens: Sequence[int], end_ids: Sequence[int]) -> tuple[int, ...]:
    """A span up to and including its first end-of-turn token (where generation stops)."""
    for index, token in enumerate(tokens):
        if token in end_ids:
            return tuple(tokens[: index + 1])
    return tuple(tokens)


def episodes_from_sft(dataset: Any, problems: Sequence[tuple[str, str]], end_ids: Sequence[int], *, with_tool: bool = True) -> list[Episode]:
    """Episodes from verl's SFT dataset over :func:`write_conversations` rows (same order as ``problems``)."""
    assistant_turns = 2 if with_tool else 1
    episodes = []
    for index, (question, truth) in enumerate(problems):
        item = dataset[index]
        ids = item["input_ids"].tolist()
        mask = item["loss_mask"].tolist()
        spans = trained_spans(ids, mask)
        if len(spans) != assistant_turns:
            raise ValueError(
                f"verl's SFT dataset trains on {len(spans)} spans of the scripted conversation with {assistant_turns} assistant turn(s), expected one per assistant turn"
            )
        turns = tuple(through_end_of_turn(s, end_ids) for s in spans)
        episodes.append(Episode(question=question, ground_truth=truth, turns=turns, expected_tool_output=expected_output(truth) if with_tool else None))
    return episodes


def missing_output_turn(tokenizer: Any, end_ids: Sequence[int]) -> tuple[int, ...]:
    return (*tokenizer.encode(MISSING_OUTPUT_TEXT, add_special_tokens=False), end_ids[0])
