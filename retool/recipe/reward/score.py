"""The ReTool reward: +1 for a correct final answer, -1 otherwise (paper §3.2), for verl.

verl loads it through the entry file :mod:`retool.recipe.verl_plugins.reward`
(``custom_reward_function.path``), executed under the module name ``custom_module``; this module
needs nothing but the installed ``retool`` package.

Optional shaping from verl's retool recipe (off by default; ``spec.rl.toolTurnShaping`` renders
``reward_kwargs.tool_turn_shaping``): a wrong answer earns 0.1 per tool call, capped at -0.6, to
encourage calling the interpreter.

Whatever verl hands over, the result has the same keys with the same types, because verl's agent
loop stacks each key over the batch (``np.array``) and a key or type that varies breaks the batch:
``score`` (float), ``acc`` (float, 1.0 or 0.0), ``pred`` (str, at most ``MAX_PRED_CHARS``),
``source`` (str, the data source) and ``reward_note`` (str: empty when the sample was graded normally, else why it could not
be, e.g. a response that is not text). Nothing here raises on odd input.

>>> compute_score("aime_2024", "... so the answer is \\\\boxed{204}.", "204")
{'score': 1.0, 'acc': 1.0, 'pred': '204', 'source': 'aime_2024', 'reward_note': ''}
>>> compute_score("aime_2024", "I think it is 7", "204")
{'score': -1.0, 'acc': 0.0, 'pred': '', 'source': 'aime_2024', 'reward_note': ''}
>>> compute_score("aime_2024", b"\\\\boxed{204}", "204")["reward_note"]
'the response is bytes, not text'
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from retool.recipe.reward.answer import extract_answer, last_boxed
from retool.recipe.reward.equivalence import DEFAULT_TIMEOUT_S, is_equivalent

__all__ = ["compute_score", "count_tool_calls", "extract_answer", "is_equivalent", "shape_wrong_answer"]

logger = logging.getLogger(__name__)

CORRECT = 1.0
WRONG = -1.0
SHAPING_BONUS_PER_CALL = 0.1
SHAPING_CAP = -0.6
MAX_PRED_CHARS = 200
"""``pred`` is cut to this: verl stores it in a fixed-width numpy string array, sized by the longest."""
MAX_TRUTHS = 16
MAX_TIMEOUT_S = 30.0
MAX_TOOL_CALLS = 10_000

_TOOL_OUTPUT = re.compile(r"<(?:tool_response|interpreter)>")
_FALSE_WORDS = frozenset({"false", "0", "no", "off", ""})
_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})


def _count(value: Any) -> int | None:
    """A non-negative whole number from an int, a float or a numeric string; None for anything else (NaN included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            return None
        return int(value) if len(value) <= 9 else MAX_TOOL_CALLS * 2 + 2
    if isinstance(value, numbers.Integral):
        return int(value) if value >= 0 else None
    if isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0 and float(value).is_integer():
        return int(value)
    return None


def count_tool_calls(solution_str: str, extra_info: Mapping[str, Any] | None, notes: list[str] | None = None) -> int:
    """Tool calls in a rollout: from verl's turn count when it is given, else from the text.

    verl's tool agent loop reports ``num_turns`` = 2 + 2 x calls (prompt, final answer, and a
    call/response pair per call) through the naive reward manager, and ``tool_rewards`` (one per
    call) through the agent-loop reward path; a response text shows one tool output per call.
    A value that is not a count is skipped (and noted in ``notes``).
    """
    info = extra_info if isinstance(extra_info, Mapping) else {}
    num_turns = info.get("num_turns")
    if num_turns is not None:
        turns = _count(num_turns)
        if turns is not None:
            return min(max(turns - 2, 0) // 2, MAX_TOOL_CALLS)
        if notes is not None:
            notes.append(f"extra_info.num_turns {str(num_turns)[:40]!r} is not a turn count")
    tool_rewards = info.get("tool_rewards")
    if tool_rewards is not None:
        if hasattr(tool_rewards, "__len__") and not isinstance(tool_rewards, str | bytes | Mapping):
            return min(len(tool_rewards), MAX_TOOL_CALLS)
        if notes is not None:
            notes.append(f"extra_info.tool_rewards is a {type(tool_rewards).__name__}, not a list")
    return len(_TOOL_OUTPUT.findall(solution_str)) if isinstance(solution_str, str) else 0


def shape_wrong_answer(tool_calls: int, *, bonus_per_call: float = SHAPING_BONUS_PER_CALL, cap: float = SHAPING_CAP) -> float:
    """Score of a wrong answer under tool-turn shaping: -1 + 0.1 per call, never above ``cap``."""
    return min(cap, WRONG + bonus_per_call * max(tool_calls, 0))


def _truths(ground_truth: Any, notes: list[str]) -> list[str]:
    """Accepted answers: one string, a number, or a sequence of them (numpy arrays included).

    A truth stored as a solution (``"... \\boxed{5}"``, as some math sets do) stands for its box.
    Anything else (None, NaN, bytes, a mapping) is no truth, and says so in ``notes``.
    """
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str | bytes):
        ground_truth = ground_truth.tolist()
    items = list(ground_truth[: MAX_TRUTHS + 1]) if isinstance(ground_truth, list | tuple) else [ground_truth]
    if len(items) > MAX_TRUTHS:
        notes.append(f"only the first {MAX_TRUTHS} ground truths are compared")
        items = items[:MAX_TRUTHS]
    truths = []
    for item in items:
        if isinstance(item, str):
            truths.append(item)
        elif isinstance(item, numbers.Real) and not isinstance(item, bool) and math.isfinite(item):
            truths.append(str(int(item)) if isinstance(item, float) and item.is_integer() else str(item))
        elif item is not None:
            notes.append(f"a ground truth of type {type(item).__name__} is not an answer")
    if not truths:
        notes.append("no usable ground truth")
    return [(last_boxed(t) or t) if "\\boxed" in t or "\\fbox" in t else t for t in truths]


def _flag(value: Any, name: str, notes: list[str]) -> bool:
    """A boolean option from verl's kwargs or a row: bools, 0/1 and true/false strings; anything else is off."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    if value is not None:
        notes.append(f"{name} {str(value)[:40]!r} is not a boolean; treated as off")
    return False


def _timeout(value: Any, notes: list[str]) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return min(float(value), MAX_TIMEOUT_S)
    notes.append(f"timeout_s {str(value)[:40]!r} is not a positive number of seconds; using {DEFAULT_TIMEOUT_S}")
    return DEFAULT_TIMEOUT_S


def _snapshot(extra_info: Any, notes: list[str]) -> dict[str, Any]:
    """A private copy of what this sample's ``extra_info`` holds now.

    verl's reward loop updates ``extra_info`` in place, and the n samples of one prompt share one
    dict: reading it twice could read another sample's values. One shallow copy, taken first,
    is all this function ever reads; the caller's dict is never written.
    """
    if extra_info is None:
        return {}
    if not isinstance(extra_info, Mapping):
        notes.append(f"extra_info is a {type(extra_info).__name__}, not a mapping; ignored")
        return {}
    try:
        return dict(extra_info)
    except Exception as exc:  # a mapping whose items() fails
        notes.append(f"extra_info could not be read ({type(exc).__name__}); ignored")
        return {}


def _result(score: float, acc: bool, pred: str | None, data_source: Any, notes: list[str]) -> dict[str, Any]:
    text = pred or ""
    if len(text) > MAX_PRED_CHARS:
        text = text[: MAX_PRED_CHARS - 3] + "..."
    try:
        source = data_source.decode("utf-8", "replace") if isinstance(data_source, bytes) else str(data_source)
    except Exception:  # an object whose str() fails
        source = f"<{type(data_source).__name__}>"
    return {"score": float(score), "acc": float(bool(acc)), "pred": text, "source": source, "reward_note": "; ".join(notes)[:300]}


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
    """Score one response: ``{"score", "acc", "pred", "source", "reward_note"}`` (see the module docstring).

    Every key becomes a column of verl's batch (the agent loop stores the result with
    ``np.array([...])`` per key and ``RayPPOTrainer`` joins it to the batch with ``DataProto.union``,
    which fails on a key the batch already holds with other values or another dtype), so no key may
    repeat a dataset column: the data source is echoed as ``source`` (verl's validation dump, the
    eval stage's per-sample results, has no data-source column of its own; verl skips strings in
    its metrics), never as ``data_source``. Values keep one type per key for every sample: ``acc``
    is a float because numpy booleans break the dump's ``json.dumps``.

    ``tool_turn_shaping`` (a ``reward_kwargs`` entry, or ``extra_info["tool_turn_shaping"]`` per row)
    replaces -1 for wrong answers by :func:`shape_wrong_answer`. ``timeout_s`` bounds the symbolic
    comparison of one answer. Other keyword arguments verl passes (``reward_router_address``,
    ``reward_model_tokenizer``) are accepted and ignored.
    """
    notes: list[str] = []
    try:
        info = _snapshot(extra_info, notes)
        shaping = _flag(tool_turn_shaping, "tool_turn_shaping", notes) or _flag(info.get("tool_turn_shaping"), "extra_info.tool_turn_shaping", notes)
        if not isinstance(solution_str, str):
            notes.insert(0, f"the response is {type(solution_str).__name__}, not text" if solution_str is not None else "no response")
            return _result(WRONG, False, None, data_source, notes)
        truths = _truths(ground_truth, notes)
        pred = extract_answer(solution_str)
        limit = _timeout(timeout_s, notes)
        acc = pred is not None and any(is_equivalent(pred, truth, timeout_s=limit) for truth in truths)
        if acc:
            score = CORRECT
        elif shaping:
            score = shape_wrong_answer(count_tool_calls(solution_str, info, notes))
        else:
            score = WRONG
        logger.debug("reward %s: pred=%.80r truth=%.80r score=%s", data_source, pred, ground_truth, score)
        return _result(score, acc, pred, data_source, notes)
    except Exception as exc:  # the reward's own failure must not end a training step; it is logged and shown
        logger.exception("reward failed on a %s sample; scored -1", data_source)
        return _result(WRONG, False, None, data_source, [*notes, f"reward error: {type(exc).__name__}: {exc}"[:200]])
