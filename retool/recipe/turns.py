"""One token sequence between training and evaluation: where turns meet, where a call begins (pure).

A chat template closes every assistant message with its end-of-turn text (Qwen's ChatML:
``<|im_end|>`` and a newline) before the next message begins. A model generates only the first
part: it stops at ``<|im_end|>``. verl 0.6.1's ``ToolAgentLoop._handle_processing_tools_state``
then appends the tool turn rendered alone (``<|im_start|>user\\n<tool_response>...``), so the
newline the template puts between the two is missing, and every multi-turn rollout is a sequence
that neither the SFT data (rendered by the template) nor a chat server at evaluation ever shows the
model (upstream: verl-project/verl PRs #6804 and #6921, fixed in verl 0.9.0).
:func:`turn_end_ids` and :func:`missing_turn_end` give the ids to put back; our agent loop
(:mod:`retool.recipe.verl_plugins.agent_loop`) inserts them, masked out like the tool turn.

:func:`token_mismatch` is the invariant's check, a pure function of two id sequences and a
tokenizer, so that any agent loop (verl 0.6.1's today, a later verl's tomorrow) is held to the
same rule: the ids the loop builds equal ``apply_chat_template`` of the same messages, id for id.

>>> missing_turn_end([11, 22, 151645], [151645, 198])
[198]
>>> missing_turn_end([11, 22], [151645, 198])
[151645, 198]
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

PROBE = "retool-turn-end-probe"
"""The assistant content rendered to find what the template writes after an assistant message."""

NEIGHBOURHOOD = 12
"""Tokens shown either side of the first differing position in a mismatch message."""


def turn_end_ids(tokenizer: Any, **template_kwargs: Any) -> list[int]:
    """The ids the chat template writes right after an assistant message's content (Qwen: ``<|im_end|>``, ``\\n``).

    Raises ValueError when the template does not render an assistant message's content verbatim
    (there is then no text to take the end of a turn from).
    """
    messages = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": PROBE}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
    at = text.rfind(PROBE)
    if at < 0:
        raise ValueError("the chat template does not render an assistant message's content verbatim: cannot tell what ends a turn")
    return list(tokenizer.encode(text[at + len(PROBE) :], add_special_tokens=False))


def missing_turn_end(generated: Sequence[int], turn_end: Sequence[int]) -> list[int]:
    """The part of ``turn_end`` a generated turn lacks: what follows the longest end of ``generated``
    that begins ``turn_end`` (all of ``turn_end`` when the model stopped without its end-of-turn token)."""
    ends = list(turn_end)
    for k in range(min(len(generated), len(ends)), 0, -1):
        if list(generated[-k:]) == ends[:k]:
            return ends[k:]
    return ends


def call_start(ids: Sequence[int], tokenizer: Any, marker: str = "<tool_call>") -> int | None:
    """The index in ``ids`` of the token where the first ``marker`` begins, or None without one.

    A marker that is one token of the vocabulary (Qwen's ``<tool_call>``) is found by id; otherwise
    by decoding prefixes (their decoded length grows with the prefix, so a bisection finds it).
    """
    token = tokenizer.convert_tokens_to_ids(marker)
    if isinstance(token, int) and token != getattr(tokenizer, "unk_token_id", None) and tokenizer.convert_ids_to_tokens(token) == marker:
        return list(ids).index(token) if token in ids else None
    text = tokenizer.decode(list(ids))
    at = text.find(marker)
    if at < 0:
        return None

    class Lengths:
        def __getitem__(self, k: int) -> int:
            return len(tokenizer.decode(list(ids[:k])))

        def __len__(self) -> int:
            return len(ids) + 1

    # The largest prefix whose text ends at or before the marker: the next token holds its first character.
    return max(bisect_right(Lengths(), at) - 1, 0)  # type: ignore[arg-type]


def first_difference(expected: Sequence[int], actual: Sequence[int]) -> int | None:
    """The first position where the two sequences differ (the shorter one's length when one extends
    the other), or None when they are equal."""
    for position, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return position
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def token_mismatch(expected: Sequence[int], actual: Sequence[int], tokenizer: Any, *, expected_name: str = "expected", actual_name: str = "actual") -> str | None:
    """None when the two id sequences are equal; else a message naming the first differing position,
    the ids there and both decoded neighbourhoods (``repr`` so that a missing newline shows)."""
    position = first_difference(expected, actual)
    if position is None:
        return None
    lo, hi = max(position - NEIGHBOURHOOD, 0), position + NEIGHBOURHOOD

    def around(ids: Sequence[int]) -> str:
        here = list(ids[position : position + 1])
        return f"id {here[0] if here else '(end)'}; {tokenizer.decode(list(ids[lo:position]))!r} | {tokenizer.decode(list(ids[position:hi]))!r}"

    return (
        f"token sequences differ at position {position} ({expected_name}: {len(expected)} ids, {actual_name}: {len(actual)} ids)\n"
        f"  {expected_name}: {around(expected)}\n"
        f"  {actual_name}: {around(actual)}"
    )
