"""The ReTool reward: +1 for a correct final answer, -1 otherwise (paper §3.2), for verl.

verl loads this file by path (``custom_reward_function.path`` = this file, ``name`` =
``compute_score``) under the module name ``custom_module``, so it uses absolute imports only and
needs nothing but the installed ``retool`` package.

Optional shaping from verl's retool recipe (off by default, ``reward_kwargs.tool_turn_shaping``):
a wrong answer earns 0.1 per tool call, capped at -0.6, to encourage calling the interpreter.

>>> compute_score("aime_2024", "... so the answer is \\\\boxed{204}.", "204")
{'score': 1.0, 'acc': True, 'pred': '204'}
>>> compute_score("aime_2024", "I think it is 7", "204")
{'score': -1.0, 'acc': False, 'pred': ''}
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from retool.recipe.answer import extract_answer, last_boxed
from retool.recipe.equivalence import DEFAULT_TIMEOUT_S, is_equivalent

__all__ = ["compute_score", "count_tool_calls", "extract_answer", "is_equivalent", "shape_wrong_answer"]

logger = logging.getLogger(__name__)

CORRECT = 1.0
WRONG = -1.0
SHAPING_BONUS_PER_CALL = 0.1
SHAPING_CAP = -0.6

_TOOL_OUTPUT = re.compile(r"<(?:tool_response|interpreter)>")


def count_tool_calls(solution_str: str, extra_info: Mapping[str, Any] | None) -> int:
    """Tool calls in a rollout: from verl's turn count when it is given, else from the text.

    verl's tool agent loop reports ``num_turns`` = 2 + 2 x calls (prompt, final answer, and a
    call/response pair per call) through the naive reward manager, and ``tool_rewards`` (one per
    call) through the agent-loop reward path; a response text shows one tool output per call.
    """
    info = extra_info or {}
    num_turns = info.get("num_turns")
    if num_turns is not None:
        return max(int(num_turns) - 2, 0) // 2
    tool_rewards = info.get("tool_rewards")
    if tool_rewards is not None:
        return len(tool_rewards)
    return len(_TOOL_OUTPUT.findall(solution_str))


def shape_wrong_answer(tool_calls: int, *, bonus_per_call: float = SHAPING_BONUS_PER_CALL, cap: float = SHAPING_CAP) -> float:
    """Score of a wrong answer under tool-turn shaping: -1 + 0.1 per call, never above ``cap``."""
    return min(cap, WRONG + bonus_per_call * max(tool_calls, 0))


def _truths(ground_truth: Any) -> list[str]:
    """Accepted answers: one string, a number, or a sequence of them (numpy arrays included).

    A truth stored as a solution (``"... \\boxed{5}"``, as some math sets do) stands for its box.
    """
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, (list, tuple)):
        truths = [str(t) for t in ground_truth if t is not None]
    elif ground_truth is None:
        truths = []
    else:
        truths = [str(ground_truth)]
    return [(last_boxed(t) or t) if "\\boxed" in t or "\\fbox" in t else t for t in truths]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    tool_turn_shaping: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **_verl_kwargs: Any,
) -> dict[str, Any]:
    """Score one response: ``{"score": +1.0 | -1.0, "acc": bool, "pred": str}``.

    ``tool_turn_shaping`` (a ``reward_kwargs`` entry, or ``extra_info["tool_turn_shaping"]`` per row)
    replaces -1 for wrong answers by :func:`shape_wrong_answer`. ``timeout_s`` bounds the symbolic
    comparison of one answer. Other keyword arguments verl passes (``reward_router_address``,
    ``reward_model_tokenizer``) are accepted and ignored.
    """
    pred = extract_answer(solution_str) if isinstance(solution_str, str) else None
    acc = pred is not None and any(is_equivalent(pred, truth, timeout_s=timeout_s) for truth in _truths(ground_truth))
    if acc:
        score = CORRECT
    elif tool_turn_shaping or bool((extra_info or {}).get("tool_turn_shaping", False)):
        score = shape_wrong_answer(count_tool_calls(solution_str or "", extra_info))
    else:
        score = WRONG
    logger.debug("reward %s: pred=%.80r truth=%.80r score=%s", data_source, pred, ground_truth, score)
    return {"score": score, "acc": acc, "pred": pred or ""}
