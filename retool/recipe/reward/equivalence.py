"""Is a predicted answer equivalent to the ground truth? Exact, then numeric, then symbolic.

The cheap stages decide almost every case in math RL (DAPO and AIME answers are integers): equal
normalised text is correct; two plain numbers are compared exactly (a decimal may be the other
value rounded at its last digit, to 1e-6 relative), and when both sides are plain numbers that
comparison is final. A few answer shapes are read structurally first: a multiple-choice letter
with or without its value (``\\textbf{(C)}\\ 34``), a percentage against the fraction it stands
for (``50\\%`` and ``0.5``), tuples and intervals of numbers item by item (``(0.5, 1.25)``), and
matrices cell by cell. An equation against a value is read side by side (:func:`equation_verdict`),
and assignments ``a=1, b=2`` against a tuple in the order written. Only answers that are not both plain
numbers reach math-verify/sympy, in a worker process with a hard deadline
(:mod:`retool.recipe.reward.symbolic`); running out of time means "not equivalent".

>>> is_equivalent("\\\\dfrac{1}{2}", "0.5")
True
>>> is_equivalent("1,000", "1000")
True
>>> is_equivalent("34", "35")
False
>>> is_equivalent("\\\\textbf{(C)}\\\\ 34", "34")
True
>>> is_equivalent("m+n=34", "34"), is_equivalent("1=34", "34")
(True, False)
"""

from __future__ import annotations

import logging
import re

from retool.recipe.reward.answer import MAX_ANSWER_CHARS, brace_pairs, normalize_answer, numbers_equal, parse_number
from retool.recipe.reward.symbolic import default_pool

logger = logging.getLogger(__name__)

# Longest raw answer that is normalised at all (a few times MAX_ANSWER_CHARS: LaTeX is verbose).
MAX_RAW_CHARS = 4 * MAX_ANSWER_CHARS

# Default hard limit of the symbolic stage of one comparison, in seconds.
DEFAULT_TIMEOUT_S = 0.5

# A multiple-choice answer in its normalised form: "(C)" with the value it names, if any.
_CHOICE = re.compile(r"^\(([A-E])\)(.*)$")
_LETTER = re.compile(r"^[A-E]$")
_MATRIX = re.compile(r"^\\begin\{pmatrix\}(.*)\\end\{pmatrix\}$")
MAX_MATRIX_CELLS = 100

# A literal exponent or factorial argument of five or more digits, or Knuth's arrows.
_HUGE_LITERAL = re.compile(r"\^\s*\{?\s*\d{5,}|\d{5,}\s*!|\\uparrow")
_EXPONENT = re.compile(r"\^\s*\{")

# An unknown in a normalised expression: a Latin letter outside commands, or a Greek letter but pi.
_GREEK = re.compile(
    r"\\(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|"
    r"Gamma|Delta|Theta|Lambda|Xi|Sigma|Upsilon|Phi|Psi|Omega)(?![A-Za-z])"
)
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LATIN = re.compile(r"[A-Za-z]")
# What separates equations in a list: ";", a quad, a line break, "and"/"or" (commas are split apart).
_LIST_SEPARATOR = re.compile(r";|\\q?quad(?![A-Za-z])|\\\\|\\(?:text|mathrm|mbox)\s*\{\s*(?:and|or)\s*\}|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])")
MAX_EQUATION_SIDES = 8
"""Longer chains are a hedge, not an answer."""


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


def split_choice(norm: str) -> tuple[str | None, str]:
    """A normalised answer as (choice letter or None, value): ``(C)34`` -> ("C", "34"), ``B`` -> ("B", "")."""
    match = _CHOICE.match(norm)
    if match:
        return match.group(1), match.group(2)
    return (norm, "") if _LETTER.match(norm) else (None, norm)


def matrix_cells(norm: str) -> list[list[str]] | None:
    """The cells of a normalised ``\\begin{pmatrix}...\\end{pmatrix}``, row by row; None for anything else."""
    match = _MATRIX.match(norm)
    if match is None or "\\begin" in match.group(1):
        return None
    rows = [row.split("&") for row in match.group(1).split("\\\\")]
    return rows if sum(len(r) for r in rows) <= MAX_MATRIX_CELLS else None


def _decided(pred: str, truth: str) -> bool | None:
    """The cheap stages on two normalised answers: True/False when they decide, None when only sympy can."""
    if pred == truth:
        return True
    num_pred, num_truth = parse_number(pred), parse_number(truth)
    if num_pred is not None and num_truth is not None:
        return numbers_equal(num_pred, num_truth)
    return None


def tuple_items(norm: str) -> tuple[str, list[str], str] | None:
    """A normalised tuple or interval as (opening bracket, items, closing bracket); None for anything else.

    Items are split at the commas outside any group, so ``(\\frac{1}{2},3)`` has two.
    """
    if len(norm) < 3 or norm[0] not in "([" or norm[-1] not in ")]" or len(norm) > MAX_ANSWER_CHARS:
        return None
    items, depth, start = [], 0, 1
    for i in range(1, len(norm) - 1):
        ch = norm[i]
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth < 0:
                return None  # "(1)(2)": the outer brackets are not one pair
        elif ch == "," and depth == 0:
            items.append(norm[start:i])
            start = i + 1
    if depth != 0:
        return None
    items.append(norm[start:-1])
    return (norm[0], items, norm[-1]) if len(items) >= 2 and all(items) else None


def _tuples(pred: str, truth: str) -> bool | None:
    """Tuples and intervals of plain numbers, item by item (``(0.5,1.25)`` is ``(\\frac12,\\frac54)``).

    Decides only when every item on both sides is a number: then the brackets, the item count and
    each item must match. Anything else (symbols, sets) is left to the symbolic stage.
    """
    tuple_pred, tuple_truth = tuple_items(pred), tuple_items(truth)
    if tuple_pred is None or tuple_truth is None:
        return None
    numbers_pred = [parse_number(item) for item in tuple_pred[1]]
    numbers_truth = [parse_number(item) for item in tuple_truth[1]]
    if None in numbers_pred or None in numbers_truth:
        return None
    if (tuple_pred[0], tuple_pred[2]) != (tuple_truth[0], tuple_truth[2]) or len(numbers_pred) != len(numbers_truth):
        return False
    return all(numbers_equal(a, b) for a, b in zip(numbers_pred, numbers_truth, strict=True))  # type: ignore[arg-type]


def _structural(pred: str, truth: str, pred_percent: bool, truth_percent: bool) -> bool | None:
    """Choice letters, percentages and matrices: True/False when the shape decides, None otherwise."""
    (letter_pred, value_pred), (letter_truth, value_truth) = split_choice(pred), split_choice(truth)
    if letter_pred is not None or letter_truth is not None:
        if letter_pred is not None and letter_truth is not None:
            if letter_pred != letter_truth:
                return False
            return True if not (value_pred and value_truth) else _decided(value_pred, value_truth)
        if not (value_pred and value_truth):
            return False  # a letter alone against a value: nothing says which value the letter named
        return _decided(value_pred, value_truth)
    if pred_percent != truth_percent:
        num_pred, num_truth = parse_number(pred), parse_number(truth)
        if num_pred is not None and num_truth is not None:
            # "50%" names 0.5 as well as the number 50 a "what percent" question asks for
            scaled = num_pred._replace(value=num_pred.value / 100) if pred_percent else num_truth._replace(value=num_truth.value / 100)
            other = num_truth if pred_percent else num_pred
            return numbers_equal(num_pred, num_truth) or numbers_equal(scaled, other)
    tuples = _tuples(pred, truth)
    if tuples is not None:
        return tuples
    cells_pred, cells_truth = matrix_cells(pred), matrix_cells(truth)
    if cells_pred is not None and cells_truth is not None:
        if [len(r) for r in cells_pred] != [len(r) for r in cells_truth]:
            return False
        verdicts = [_decided(a, b) for ra, rb in zip(cells_pred, cells_truth, strict=True) for a, b in zip(ra, rb, strict=True)]
        if False in verdicts:
            return False
        return True if None not in verdicts else None
    return None


def split_top_level(text: str, separator: str) -> list[str]:
    """``text`` cut at each ``separator`` outside braces, parentheses and brackets (``\\(``/``\\[`` are math delimiters, not groups)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{([" and not (ch != "{" and i and text[i - 1] == "\\"):
            depth += 1
        elif ch in "})]" and not (ch != "}" and i and text[i - 1] == "\\"):
            depth -= 1
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def names_a_quantity(norm: str) -> bool:
    """Whether a normalised expression holds an unknown: a Latin letter (``m+n``, ``AB``, ``f(2)``) or a Greek one other than pi.

    Commands and numbers alone (``2\\sqrt{3}``, ``\\frac{\\pi}{2}``, ``\\emptyset``) are a value.
    """
    return _GREEK.search(norm) is not None or _LATIN.search(_COMMAND.sub(" ", norm)) is not None


def _equation_sides(pred: str) -> list[str] | None:
    """The raw sides of an equation or a chain ``a = b = c``; None when ``pred`` is not one (a relation ``<=``, a list)."""
    sides = split_top_level(pred, "=")
    if len(sides) < 2:
        return None
    if any(side.endswith(("<", ">", "!", ":", "\\")) or side.startswith(("<", ">")) for side in sides) or not all(s.strip() for s in sides):
        return None  # <=, >=, !=, :=, ==, an escaped "=": not an equation of values
    return sides


def equation_verdict(pred: str, truth: str, timeout_s: float) -> bool | None:
    """An answer written as an equation, against a truth that is a value; None when the shape does not apply.

    The asked quantity named and then its value (``m+n=34``, AIME's "find m+n") answers 34. The rule:
    a side with an unknown names the quantity, every side without one is a value, and every value
    must equal the truth, so ``34=m+n`` and ``m+n=13+21=34`` answer 34, while a false equation
    (``1=34``), a hedge (``m+n=35=34``) and an equation between unknowns (``m=34n``) answer nothing
    right, and a list of equations (``x=34; y=35``) states no single value.

    This is stricter than math-verify 0.9, which reads only the last side when the truth is no
    equation ("1 and 9=1 -> 1,1", ``sympy_expr_eq`` in its ``grader.py``), and verl's DAPO reward
    (``normalize_final_answer`` in ``verl/utils/reward_score/math_dapo.py`` keeps
    ``split("=")[-1]``): both accept ``1=34``. verl's MATH reward (``strip_string``) strips only a
    left side of at most two characters, so it rejects ``m+n=34``. Assignments ``a=1, b=2`` against
    a tuple are its items in the order written, as in math-verify (``a=2, b=1`` is not ``(1,2)``);
    an unknown assigned twice makes no tuple.

    Plain-number values are decided here, with no worker process and so no cold start; a value
    that is an expression (``13+21``) goes to the symbolic stage with its share of ``timeout_s``.
    """
    norm_truth = normalize_answer(truth)
    if "=" in norm_truth or names_a_quantity(norm_truth):
        return None  # an equation or an expression of unknowns: math-verify's rules apply
    sides = _equation_sides(pred)
    if sides is None:
        return None
    norms = [normalize_answer(side) for side in sides]
    if _LIST_SEPARATOR.search(pred) or any(len(split_top_level(norm, ",")) > 1 for norm in norms):
        # several equations (``a=1, b=2``, ``x=34; y=35``): a tuple's items in order, never one number
        verdict = _assignments(split_top_level(_LIST_SEPARATOR.sub(",", pred), ","), truth, timeout_s)
        return False if verdict is None and parse_number(norm_truth) is not None else verdict
    if len(sides) > MAX_EQUATION_SIDES:
        return False
    values = [(side, norm) for side, norm in zip(sides, norms, strict=True) if not names_a_quantity(norm)]
    if not values:
        return False  # unknowns only: no value is stated
    values.sort(key=lambda value: parse_number(value[1]) is None)  # plain numbers first: a wrong one ends it without sympy
    return all(is_equivalent(side, truth, timeout_s / len(values)) for side, _ in values)


def _assignments(items: list[str], truth: str, timeout_s: float) -> bool | None:
    """``a=1, b=2`` against a tuple ``(1,2)``: the values in the order written; None unless every item is ``name=value``."""
    tuple_truth = tuple_items(normalize_answer(truth))
    if tuple_truth is None or (tuple_truth[0], tuple_truth[2]) != ("(", ")") or len(items) > MAX_MATRIX_CELLS:
        return None
    names, values = [], []
    for item in items:
        sides = _equation_sides(item)
        if sides is None or len(sides) != 2:
            return None
        name, value = normalize_answer(sides[0]), sides[1]
        if not names_a_quantity(name) or names_a_quantity(normalize_answer(value)):
            return None
        names.append(name)
        values.append(value.strip())
    if len(set(names)) != len(names) or len(values) != len(tuple_truth[1]):
        return False
    return is_equivalent(f"({','.join(values)})", truth, timeout_s)


def is_equivalent(pred: str, truth: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``pred`` states the same answer as ``truth``; sympy gets at most ``timeout_s`` of it."""
    if not isinstance(pred, str) or not isinstance(truth, str):
        return False
    if len(pred) > MAX_RAW_CHARS or len(truth) > MAX_RAW_CHARS:
        return pred.strip() == truth.strip()  # no math answer is this long; normalising it only costs time
    norm_pred, norm_truth = normalize_answer(pred), normalize_answer(truth)
    if not norm_pred or not norm_truth:
        return False
    structural = _structural(norm_pred, norm_truth, "%" in pred, "%" in truth)
    if structural is not None:
        return structural
    decided = _decided(norm_pred, norm_truth)
    if decided is not None:
        return decided
    if len(norm_pred) > MAX_ANSWER_CHARS or len(norm_truth) > MAX_ANSWER_CHARS:
        return False
    if "=" in norm_pred:
        equation = equation_verdict(pred, truth, timeout_s)
        if equation is not None:
            return equation
    if looks_explosive(norm_pred) or looks_explosive(norm_truth):
        logger.debug("not comparing a power tower symbolically: %.80s", norm_pred)
        return False
    result = default_pool().compare(norm_pred, norm_truth, timeout_s)
    return bool(result)
