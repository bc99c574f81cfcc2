"""The paper's code-invocation timing and code lines, computed by hand from a rollout's decoded token ids.

Independent of the agent loop's bookkeeping (:mod:`retool.recipe.verl_plugins.call_record`) and of
``extract_code``: the first call's position is the index of the first ``<tool_call>`` token among the
response ids, over the response's length (ReTool §4, "code invocation timing": where the model reaches
for the tool); a call's code lines are the non-blank lines of its decoded ``code`` argument, less the
Markdown fence lines (```` ``` ````...) that the tool never runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def first_call_position(response_ids: Sequence[int], tokenizer: Any) -> float | None:
    marker = tokenizer.convert_tokens_to_ids("<tool_call>")
    ids = list(response_ids)
    return ids.index(marker) / len(ids) if marker in ids else None


def call_code_lines(response_ids: Sequence[int], response_mask: Sequence[int], tokenizer: Any) -> list[int]:
    """Code lines of every call the model wrote (only its own tokens: tool output is masked out)."""
    text = tokenizer.decode([t for t, m in zip(response_ids, response_mask, strict=True) if m], skip_special_tokens=False)
    lines = []
    for match in _CALL.finditer(text):
        code = json.loads(match.group(1))["arguments"]["code"]
        lines.append(sum(1 for line in code.splitlines() if line.strip() and not line.strip().startswith("```")))
    return lines


def expected_metrics(rollouts: Sequence[tuple[Sequence[int], Sequence[int]]], tokenizer: Any) -> dict[str, float]:
    """``tool/first_call_position_mean``, ``tool/code_lines_per_call_mean`` and ``..._per_response_mean`` of (response ids, mask) pairs."""
    positions = [p for ids, _ in rollouts if (p := first_call_position(ids, tokenizer)) is not None]
    per_response = [call_code_lines(ids, mask, tokenizer) for ids, mask in rollouts]
    calls = [n for lines in per_response for n in lines]
    return {
        "tool/first_call_position_mean": sum(positions) / len(positions),
        "tool/code_lines_per_call_mean": sum(calls) / len(calls),
        "tool/code_lines_per_response_mean": sum(sum(lines) for lines in per_response if lines) / sum(1 for lines in per_response if lines),
    }
