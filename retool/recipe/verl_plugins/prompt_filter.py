"""Pure parts of the RL dataset's prompt filter: measure a prompt as the tool agent renders it, decide what to keep.

Kept apart from ``retool.recipe.verl_plugins.dataset`` because verl executes that file by path as a module that is
not in ``sys.modules``, where dataclasses cannot be defined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LENGTH_COLUMN = "_retool_prompt_tokens"
UNRENDERABLE = -1


def prompt_token_count(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: Mapping[str, Any]) -> int:
    """Tokens of the prompt exactly as the tool agent loop renders it (tools, generation prompt)."""
    ids = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=True, **template_kwargs)
    if isinstance(ids, Mapping):  # return_dict=True in the template kwargs
        ids = ids["input_ids"]
    return len(ids)


@dataclass(frozen=True)
class PromptFilterReport:
    total: int
    kept: int
    too_long: int
    unrenderable: int
    max_prompt_length: int

    def render(self) -> str:
        return (
            f"kept {self.kept} of {self.total} prompts: {self.too_long} longer than max_prompt_length={self.max_prompt_length} tokens "
            f"(with the tool schema), {self.unrenderable} failed to render with the chat template"
        )


def filter_report(lengths: np.ndarray, max_prompt_length: int) -> tuple[np.ndarray, PromptFilterReport]:
    """Indices of the prompts to keep, and the counts of what was dropped and why."""
    unrenderable = lengths == UNRENDERABLE
    too_long = lengths > max_prompt_length
    keep = np.flatnonzero(~unrenderable & ~too_long)
    return keep, PromptFilterReport(
        total=int(lengths.size),
        kept=int(keep.size),
        too_long=int(too_long.sum()),
        unrenderable=int(unrenderable.sum()),
        max_prompt_length=int(max_prompt_length),
    )
