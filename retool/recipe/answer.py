"""Final-answer extraction and normalisation: pure string functions, linear in the input.

A response in a ReTool rollout interleaves the model's reasoning with code it wrote and the
interpreter's output. Only the model's own words can hold its answer: a ``\\boxed{}`` printed by the
code or echoed by the sandbox is not a claim the model made, so tool calls and tool output are cut
out before anything is searched.

Precedence (last occurrence wins within each rule):
  1. ``\\boxed{...}`` / ``\\boxed 5`` / ``\\fbox{...}``;
  2. ``<answer>...</answer>`` (the ReTool SFT format, when it holds no box);
  3. an ``Answer: ...`` line (the DAPO prompt format).

>>> extract_answer("so x = 3 and \\\\boxed{\\\\frac{1}{2}}.")
'\\\\frac{1}{2}'
>>> normalize_answer("$1{,}000\\\\text{ cm}$")
'1000'
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import NamedTuple

# Regions that are not the model's own prose: tool calls (code) and tool output. An unclosed region
# (a response truncated mid-call) runs to the end of the text.
_TOOL_REGION = re.compile(r"<(interpreter|tool_response|tool_call|code|output)>.*?(?:</\1>|\Z)", re.S | re.I)
_FENCED_REGION = re.compile(r"```(?:python|py|output|text)?[ \t]*\n.*?(?:```|\Z)", re.S)

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_LINE = re.compile(
    r"^[ \t>*#_`-]*(?:the[ \t]+)?(?:final[ \t]+)?answer(?:[ \t]+is)?[ \t*_]*[:：][ \t*_]*(?P<ans>[^\n]*)$",
    re.I | re.M,
)

# Longest answer we try to interpret at all; longer ones only match by exact normalised text.
MAX_ANSWER_CHARS = 1000


def strip_tool_regions(text: str) -> str:
    """Remove tool calls and tool output (``<interpreter>``, ``<tool_response>``, code fences...)."""
    text = _TOOL_REGION.sub(" ", text)
    return _FENCED_REGION.sub(" ", text)


_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.S)


def brace_pairs(text: str, start: int = 0) -> dict[int, int]:
    """Index of every ``{`` with a match -> index of its ``}`` (escaped braces skipped), in one pass from ``start``.

    Computed once per string, so that input full of unclosed braces costs linear time, where
    matching each brace by scanning forward would be quadratic; the regex visits only braces and
    backslashes.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for match in _BRACE_TOKENS.finditer(text, start):
        token = match.group()
        if token == "{":
            stack.append(match.start())
        elif token == "}" and stack:
            pairs[stack.pop()] = match.start()
    return pairs


def _box_argument(text: str, pos: int, pairs: dict[int, int]) -> str | None:
    """Argument of a ``\\boxed`` whose name ends at ``pos``: a brace group or, after a space, one token."""
    i = pos
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        end = pairs.get(i)
        return text[i + 1 : end] if end is not None else None
    if i == pos:
        return None  # "\boxed5" is not LaTeX
    j = i
    while j < n and not text[j].isspace() and text[j] not in "$,;":
        j += 1
    token = text[i:j].rstrip(".")
    return token or None


def last_boxed(text: str) -> str | None:
    """The last well-formed, non-empty ``\\boxed``/``\\fbox`` argument in ``text``."""
    boxes = list(_BOX_COMMAND.finditer(text))
    if not boxes:
        return None
    # The last box usually decides: match braces from it first, from the first box only if needed.
    pairs = brace_pairs(text, boxes[-1].start())
    for index, match in enumerate(reversed(boxes)):
        if index == 1:
            pairs = brace_pairs(text, boxes[0].start())
        argument = _box_argument(text, match.end(), pairs)
        if argument is not None and argument.strip():
            return argument.strip()
    return None


def extract_answer(text: str) -> str | None:
    """The model's final answer in a response, or None when it gave none (see module docstring)."""
    if not isinstance(text, str) or not text:
        return None
    prose = strip_tool_regions(text)
    boxed = last_boxed(prose)
    if boxed is not None:
        return boxed
    tags = [m.group(1).strip() for m in _ANSWER_TAG.finditer(prose)]
    tags = [t for t in tags if t]
    if tags:
        return tags[-1]
    lines = [m.group("ans").rstrip(" \t*_") for m in _ANSWER_LINE.finditer(prose)]
    lines = [a.rstrip(".").strip() for a in lines if a.strip()]
    return lines[-1] if lines else None


# --- normalisation -----------------------------------------------------------------------------

_UNICODE = {
    "\u2212": "-",  # minus sign
    "\u2010": "-",
    "\u2011": "-",
    "\u2012": "-",
    "\u2013": "-",
    "\u2014": "-",
    "\ufe63": "-",
    "\uff0d": "-",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u3000": " ",
    "\u00b0": "",  # degree sign
    "\u00d7": "\\times ",
    "\u00b7": "\\cdot ",
    "\u03c0": "\\pi ",
    "\u221e": "\\infty ",
    "\u221a": "\\sqrt",
    "\u00b2": "^2",
    "\u00b3": "^3",
    "\u2044": "/",
    "\uff0c": ",",
    "\uff1a": ":",
}
_UNICODE_TABLE = str.maketrans(_UNICODE)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_TEXT_COMMANDS = re.compile(r"\\(?:text|textrm|textnormal|mbox|mathrm|textbf|mathbf|textit|mathit|operatorname)\s*\{")
_UNIT_WORDS = re.compile(r"^[\sA-Za-z.]*$")
_UNIT_TAIL = re.compile(r"\s*(?:\^\s*\{?\s*\d\s*\}?|(?P<den>(?:/|\\cdot|\\,)\s*\\(?:text|mathrm|mbox)\s*\{))")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b|\\textdegree\b|\s*degrees?\b\.?")
_SPACING = re.compile(r"\\[!,;:> ]|~|\\quad\b|\\qquad\b")
_DROPPED = re.compile(r"\\displaystyle(?![A-Za-z])|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\big(?:l|r)?(?![A-Za-z])")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d|[A-Za-z])\s*(\d|[A-Za-z])")
_FRAC_HALF = re.compile(r"\\frac\s*(\d|[A-Za-z])\s*\{")
_FRAC_HALF2 = re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d|[A-Za-z])")
_SQRT_SHORT = re.compile(r"\\sqrt\s*(\d|[A-Za-z])")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!=)")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_TRAILING_UNIT = re.compile(r"^([+-]?[\d.]+(?:/\d+)?)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]+)*(?:\^?\d)?$")
_LEADING_ZEROS = re.compile(r"^([+-]?)0+(\d+)$")
_WHITESPACE = re.compile(r"\s+")
_COMMAND_SPACE = re.compile(r"(\\[A-Za-z]+) (?=[A-Za-z0-9])")


def _replace_text_commands(s: str) -> str:
    """Unwrap ``\\text{...}``-like groups; drop them when they are a unit after something else."""
    pairs = brace_pairs(s)
    out: list[str] = []
    last = ""  # last non-blank character emitted so far: a unit follows a number or a group
    pos = 0
    for match in _TEXT_COMMANDS.finditer(s):
        if match.start() < pos:
            continue
        close = pairs.get(match.end() - 1)
        if close is None:
            continue
        content, end = s[match.end() : close], close + 1
        before = s[pos : match.start()]
        if before.strip():
            last = before.rstrip()[-1]
        is_unit = (last.isdigit() or last == "}") and _UNIT_WORDS.match(content) is not None
        if is_unit:
            # a unit's power and a compound unit ("\\text{ cm}^2", "\\text{m}/\\text{s}") go with it
            while tail := _UNIT_TAIL.match(s, end):
                if tail.group("den"):
                    next_close = pairs.get(tail.end() - 1)
                    if next_close is None or _UNIT_WORDS.match(s[tail.end() : next_close]) is None:
                        break
                    end = next_close + 1
                else:
                    end = tail.end()
        out.append(before)
        replacement = " " if is_unit and not s[end:].strip() else ("" if is_unit else content)
        out.append(replacement)
        if replacement.strip():
            last = replacement.rstrip()[-1]
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _strip_outer_braces(s: str) -> str:
    """``{{ 5 }}`` -> ``5``: remove braces that enclose the whole answer, in one pass."""
    pairs = brace_pairs(s)
    i, j = 0, len(s) - 1
    while i < j and s[i] == "{" and pairs.get(i) == j:
        i, j = i + 1, j - 1
        while i <= j and s[i].isspace():
            i += 1
        while j >= i and s[j].isspace():
            j -= 1
    return s[i : j + 1]


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer: the exact-match key and the input of the numeric parser."""
    s = _CONTROL.sub("", answer.translate(_UNICODE_TABLE)).strip()
    s = s.replace("\\$", "").replace("$", "")  # math delimiters and escaped currency signs
    s = re.sub(r"\\[()\[\]]", "", s)
    s = _DROPPED.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _replace_text_commands(s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",")
    s = _SPACING.sub("", s)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF.sub(r"\\frac{\1}{", s)
    s = _FRAC_HALF2.sub(r"\\frac\1{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _WHITESPACE.sub(" ", s).strip()
    s = _strip_outer_braces(s)
    if s.count("=") == 1:
        s = _ASSIGNMENT.sub("", s)
    s = s.rstrip(".").strip()
    unit = _TRAILING_UNIT.match(s)
    if unit:
        s = unit.group(1)
    s = _COMMAND_SPACE.sub("\\1\x00", s).replace(" ", "").replace("\x00", " ")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = s.lstrip("+") if s.startswith("+") and len(s) > 1 else s
    zeros = _LEADING_ZEROS.match(s)
    if zeros:
        s = zeros.group(1) + zeros.group(2)
    if s == "-0":
        s = "0"
    return s


# --- numbers -----------------------------------------------------------------------------------

_INTEGER = re.compile(r"^[+-]?\d+$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+)$")
_SCIENTIFIC = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]|\\times10\^\{?|\*10\*\*|\\cdot10\^\{?)([+-]?\d+)\}?$")
_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_SLASH = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_MAX_DIGITS = 400
_MAX_EXPONENT = 400


class Number(NamedTuple):
    """An answer read as a number: its exact value and, for a decimal, the power of ten of its last digit."""

    value: Fraction
    last_digit: int | None = None  # -2 for "0.25", 1 for "1.5e2" (150, last digit the tens); None: exact


def _places(mantissa: str) -> int:
    return -len(mantissa.split(".", 1)[1]) if "." in mantissa else 0


def parse_number(s: str) -> Number | None:
    """A normalised answer as a :class:`Number` (integers, decimals, fractions, scientific), else None.

    Bounded: digit strings and exponents longer than a few hundred are not numbers we grade
    (an AIME answer is below 1000), so a huge literal cannot cost time here.
    """
    if len(s) > _MAX_DIGITS:
        return None
    if _INTEGER.match(s):
        return Number(Fraction(int(s)))
    if _DECIMAL.match(s):
        try:
            return Number(Fraction(Decimal(s)), _places(s))
        except InvalidOperation:
            return None
    match = _SCIENTIFIC.match(s)
    if match:
        exponent = int(match.group(2))
        if abs(exponent) > _MAX_EXPONENT:
            return None
        return Number(Fraction(Decimal(match.group(1))) * Fraction(10) ** exponent, _places(match.group(1)) + exponent)
    match = _FRACTION.match(s)
    if match:
        sign, num, den = match.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return Number(-value if sign == "-" else value)
    match = _SLASH.match(s)
    if match:
        num, den = match.groups()
        if int(den) == 0:
            return None
        return Number(Fraction(int(num), int(den)))
    return None


def numbers_equal(a: Number, b: Number, rel_tol: float = 1e-6) -> bool:
    """Exact for integers and fractions; a decimal may be the other value rounded, to 1e-6 relative.

    ``0.3333333`` is 1/3 rounded to seven places, ``0.33`` is too coarse, and ``1000000.5`` is not
    ``1000000`` (a relative tolerance alone would accept it).
    """
    if a.value == b.value:
        return True
    difference = abs(a.value - b.value)
    if difference > Fraction(rel_tol) * max(abs(a.value), abs(b.value)):
        return False
    rounded = [n for n in (a, b) if n.last_digit is not None]
    # within half a unit of the last written digit of a decimal side
    return any(difference <= Fraction(10) ** n.last_digit / 2 for n in rounded)
