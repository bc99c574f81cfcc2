"""verl 0.9.1's ``MultiTurnSFTDataset``, each message tokenized in its conversation, as verl 0.6.1 did.

verl 0.9.1 renders every message *alone* (``_process_single_message``: ``messages=[message]``, the system
prompt cut off by length) and concatenates; ``sanity_check`` then compares the concatenation with the
template's rendering of the whole conversation and raises unless ``ignore_input_ids_mismatch``. For
Qwen3 that fails on every assistant turn with reasoning: alone, the message is the template's first, at
or before ``last_query_index``, so its ``<think>`` block is dropped, while in the conversation (after
the user's question) it is kept. SFT would stop at its first row, or, with the check off, train on turns
without the reasoning the RL rollouts and ``retool eval`` show the model (tests/verl09/test_token_parity.py).

Here message *i*'s ids are the template's rendering of ``messages[:i+1]`` less that of ``messages[:i]``
(for an assistant message the generation prompt in between is masked out), exactly verl 0.6.1's
``MultiTurnSFTDataset._process_message_tokens``: the concatenation is the whole conversation's rendering
wherever the template renders a prefix the same way inside the conversation (Qwen2.5, and Qwen3 with
non-empty reasoning). The exception is Qwen3's turn with *empty* reasoning followed by another turn:
the template writes its ``<think></think>`` only when it is the last turn, so the concatenation (each
turn as the model generates it, think block first, which is what the RL rollout holds) differs from
the whole rendering by design; 0.6.1 warned and trained the concatenation, and the 0.9 line's sft stage
does the same (``data.ignore_input_ids_mismatch=true``; docs/verl-lines.md). Everything else (padding,
truncation, position ids) stays verl 0.9.1's. Multimodal rows (a processor) keep verl's own path.

Configure with ``data.custom_cls.path=pkg://retool.recipe.verl_plugins.v0_9.sft_dataset`` and
``data.custom_cls.name=RetoolSFTDataset`` (verl 0.9.1 ``trainer/sft_trainer.py`` ``create_sft_dataset``);
the 0.9 line's sft stage renders both.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class RetoolSFTDataset(MultiTurnSFTDataset):
    """``MultiTurnSFTDataset`` whose messages are tokenized as prefixes of their conversation."""

    _row_tools: list[dict[str, Any]] | None = None

    def __getitem__(self, item: int) -> dict[str, Any]:
        # verl hands the row's tools to the first message only; every prefix rendering needs them.
        self._row_tools = self.tools[item] if self.tools is not None else None
        return super().__getitem__(item)

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool, enable_thinking: bool | None) -> str:
        if not messages:
            return ""
        kwargs = dict(self.apply_chat_template_kwargs or {})
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        return self.tokenizer.apply_chat_template(messages, tools=self._row_tools, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _process_single_message(
        self,
        index: int,
        message: dict[str, Any],
        full_message: list,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self.processor is not None:
            return super()._process_single_message(index, message, full_message, tools=tools, enable_thinking=enable_thinking)
        before = self._render(full_message[:index], generation_prompt=False, enable_thinking=enable_thinking)
        through = self._render(full_message[: index + 1], generation_prompt=False, enable_thinking=enable_thinking)
        if message["role"] == "assistant":
            prompted = self._render(full_message[:index], generation_prompt=True, enable_thinking=enable_thinking)
            prompt_ids = self._ids(prompted[len(before) :])
            content_ids = self._ids(through[len(prompted) :])
            ids, mask = prompt_ids + content_ids, [0] * len(prompt_ids) + [1] * len(content_ids)
        else:
            ids = self._ids(through[len(before) :])
            mask = [0] * len(ids)
        input_ids = torch.tensor(ids, dtype=torch.long)
        return input_ids, torch.tensor(mask, dtype=torch.long), torch.ones_like(input_ids), {}
