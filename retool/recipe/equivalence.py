"""Is a predicted answer equivalent to the ground truth? Exact, then numeric, then symbolic.

The cheap stages decide almost every case in math RL (DAPO and AIME answers are integers): equal
normalised text is correct; two plain numbers are compared exactly (a decimal may be the other
value rounded at its last digit, to 1e-6 relative), and when both sides are plain numbers that
comparison is final. Only answers that are not
both plain numbers reach math-verify/sympy, in a worker process with a hard deadline
(:mod:`retool.recipe.symbolic`); running out of time means "not equivalent".

>>> is_equivalent("\\\\dfrac{1}{2}", "0.5")
True
>>> is_equivalent("1,000", "1000")
True
>>> is_equivalent("34", "35")
False
"""

from __future__ import annotations

import logging
import re

from retool.recipe.answer import MAX_ANSWER_CHARS, brace_pairs, normalize_answer, numbers_equal, parse_number
from retool.recipe.symbolic import default_pool

logger = logging.getLogger(__name__)

# Longest raw answer that is normalised at all (a few times MAX_ANSWER_CHARS: LaTeX is verbose).
MAX_RAW_CHARS = 4 * MAX_ANSWER_CHARS

# Default hard limit of the symbolic stage of one comparison, in seconds.
DEFAULT_TIMEOUT_S = 0.5

# A literal exponent or factorial argument of five or more digits, or Knuth's arrows.
_HUGE_LITERAL = re.compile(r"\^\s*\{?\s*\d{5,}|\d{5,}\s*!|\\uparrow")
_EXPONENT = re.compile(r"\^\s*\{")


def looks_explosive(answer: str) -> bool:
    """True for power towers and huge literals whose symbolic evaluation could run for minutes.

    Such answers (``9^{9^{9^9}}``, ``2^{123456}``) are not compared symbolically: the exact and
    numeric stages still apply, and skipping sympy spares a worker restart per attempt.
    """
    if _HUGE_LITERAL.search(answer):
        return True
    pairs = brace_pairs(answer)
    for match in _EXPONENT.finditer(answer):
        close = pairs.get(match.end() - 1)
        if close is not None and "^" in answer[match.end() : close]:
            return True
    return False


def is_equivalent(pred: str, truth: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``pred`` states the same answer as ``truth``; sympy gets at most ``timeout_s`` of it."""
    if not isinstance(pred, str) or not isinstance(truth, str):
        return False
    if len(pred) > MAX_RAW_CHARS or len(truth) > MAX_RAW_CHARS:
        return pred.strip() == truth.strip()  # no math answer is this long; normalising it only costs time
    norm_pred, norm_truth = normalize_answer(pred), normalize_answer(truth)
    if not norm_pred or not norm_truth:
        return False
    if norm_pred == norm_truth:
        return True
    num_pred, num_truth = parse_number(norm_pred), parse_number(norm_truth)
    if num_pred is not None and num_truth is not None:
        return numbers_equal(num_pred, num_truth)
    if len(norm_pred) > MAX_ANSWER_CHARS or len(norm_truth) > MAX_ANSWER_CHARS:
        return False
    if looks_explosive(norm_pred) or looks_explosive(norm_truth):
        logger.debug("not comparing a power tower symbolically: %.80s", norm_pred)
        return False
    result = default_pool().compare(norm_pred, norm_truth, timeout_s)
    return bool(result)
