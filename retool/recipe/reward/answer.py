"""Final-answer extraction and normalisation: pure string functions, linear in the input.

A response in a ReTool rollout interleaves the model's reasoning with code it wrote and the
interpreter's output. Only the model's own words can hold its answer: a ``\\boxed{}`` printed by the
code or echoed by the sandbox is not a claim the model made, so tool calls and tool output are cut
out before anything is searched.

Precedence (last occurrence wins within each rule):
  1. ``\\boxed{...}`` / ``\\boxed 5`` / ``\\fbox{...}`` / ``\\framebox{...}`` -- unless the model
     states an answer AFTER its last box (an ``Answer: ...``, "the final answer is ...", or a plain
     "so the answer is 34") whose answer is math, not prose: the boxes were intermediate values;
  2. ``<answer>...</answer>`` (the ReTool SFT format, when it holds no box);
  3. ``Answer: ...`` (the DAPO prompt format), at a line start or after a sentence on the same line;
  4. a plain statement "The (final) answer is 34." when nothing above is there;
  5. a bare final line: the response's last line of prose is a value alone (``34``, ``**34**``,
     ``$$\\frac{7}{2}$$``), not a list marker (``2.``) and no prose.

A trailing parenthetical remark in prose (``34 (the number of apples)``) is not part of the answer.

Every pass over the text is a regex scan or a single loop, so extraction time is linear in the
input, and only the last ``MAX_RESPONSE_CHARS`` of a response are read at all.

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

# \framebox may carry optional [width][position] arguments before its brace group.
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox|framebox(?:\[[^\]\n]{0,40}\]){0,2})(?![A-Za-z])")
_ANSWER_TAG_TOKEN = re.compile(r"<(/?)answer>", re.I)
# Matched at a line start (found through the positions of "answer", see _statements).
_ANSWER_LINE = re.compile(r"[ \t>*#_`-]*(?:the[ \t]+)?(?P<final>final[ \t]+)?answer(?:[ \t]+is)?[ \t*_]*[:：][ \t*_]*(?P<ans>[^\n]*)", re.I)
# "The final answer is 34." / "so the answer is $\frac12$": the rest of the line, cut at the sentence's end.
# The answer is read by a bounded lookahead, so statements on one line do not swallow each other and a
# long line costs at most STATEMENT_CHARS per statement.
STATEMENT_CHARS = 300
_ANSWER_STATEMENT = re.compile(r"answer[ \t]+is[ \t]*[:：]?[ \t*_]*(?=(?P<ans>[^\n]{0,%s}))".replace("%s", str(STATEMENT_CHARS)), re.I)
# "Answer:" after a sentence on the same line ("We add them up. Answer: 34"): what may end that sentence.
_MIDLINE_ANSWER = re.compile(r"answer[ \t*_]*[:：][ \t*_]*(?=(?P<ans>[^\n]{0,%s}))".replace("%s", str(STATEMENT_CHARS)), re.I)
_MIDLINE_LEAD = re.compile(r"(?:^|[.!?;:,)\]$])[ \t*_]*(?:the[ \t]+)?(?:final[ \t]+)?$", re.I)
# A trailing remark in parentheses that holds a word ("(the number of apples)", "(\text{dozen eggs})").
_TRAILING_REMARK = re.compile(r"\s*(?:\\text\s*\{\s*)?\(([^()\n]{1,120})\)(?:\s*\})?\s*\.?\s*$")
# A bare final line: a value with at most math delimiters and emphasis around it.
_BARE_DECORATION = re.compile(r"^(?:\$\$|\$|\\\[|\\\(|\*\*|__|\*)?(?P<value>.*?)(?:\$\$|\$|\\\]|\\\)|\*\*|__|\*)?[ \t]*$", re.S)
_REMARK_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{2,}(?![A-Za-z])")
_LIST_MARKER = re.compile(r"^\(?\d{1,3}[.)]$")
_HAS_VALUE = re.compile(r"\d|\\[A-Za-z]")
MAX_BARE_CHARS = 80
_FINAL_BEFORE = re.compile(r"(?<![a-z0-9_])final[ \t]+$", re.I)
_SENTENCE_END = re.compile(r"\.(?:\s|$)|[;!?](?:\s|$)")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_CLOSING_TOOL_TAG = re.compile(r"<(/?)(interpreter|tool_response|tool_call|code|output)>", re.I)
_ZERO_WIDTH_CHARS = "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\ufeff"
_ZERO_WIDTH = re.compile(f"[{_ZERO_WIDTH_CHARS}]")

# Longest answer we try to interpret at all; longer ones only match by exact normalised text.
MAX_ANSWER_CHARS = 1000

# Only the tail of a longer response is read: a final answer is at the end, and a cap bounds the
# cost of any input (a rollout of 16k tokens is ~60k characters; this is sixteen times that).
MAX_RESPONSE_CHARS = 1_000_000


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


def _last_box(text: str) -> tuple[str, int] | None:
    """The last well-formed, non-empty box argument in ``text`` and the position where that box starts."""
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
            return argument.strip(), match.start()
    return None


def last_boxed(text: str) -> str | None:
    """The last well-formed, non-empty ``\\boxed``/``\\fbox``/``\\framebox`` argument in ``text``."""
    found = _last_box(text)
    return found[0] if found else None


def answer_tags(text: str) -> list[str]:
    """Non-empty contents of ``<answer>...</answer>`` pairs, in one pass (an unclosed tag costs nothing)."""
    found: list[str] = []
    opened: int | None = None
    for match in _ANSWER_TAG_TOKEN.finditer(text):
        if not match.group(1):
            if opened is None:
                opened = match.end()
        elif opened is not None:
            content = text[opened : match.start()].strip()
            if content:
                found.append(content)
            opened = None
    return found


class _Statement(NamedTuple):
    start: int
    answer: str
    final: bool
    """Says "final answer" or is an ``Answer:`` line: strong enough to correct an earlier box."""


def strip_trailing_remark(answer: str) -> str:
    """``34 (the number of apples)`` -> ``34``: a parenthetical holding prose is a remark, not the value.

    A remark is words: two of two letters or more (``(in cm)``), or one of four or more
    (``(approximately)``). ``2(x+1)``, ``2(ab)``, ``2(abc)`` (products), ``\\sin(x)`` and a choice
    ``(C)`` stay, and nothing goes when the remark is all there is.
    """
    match = _TRAILING_REMARK.search(answer)
    if match is None or not answer[: match.start()].strip():
        return answer
    words = _REMARK_WORD.findall(_LATEX_COMMAND.sub(" ", match.group(1)))
    if len(words) < 2 and not any(len(w) >= 4 for w in words):
        return answer
    if answer[: match.start()].rstrip().endswith(("\\text{", "\\text {")):
        return answer
    return answer[: match.start()].rstrip()


def _clean_statement(answer: str) -> str:
    return strip_trailing_remark(answer.strip().strip("*_").strip().rstrip(".").strip()).rstrip(" .,;")


def _answer_positions(prose: str) -> tuple[str, list[int]]:
    """The lower-cased text and where "answer" occurs in it: str.find is far faster than a case-insensitive regex scan."""
    lower = prose.lower()
    if len(lower) != len(prose):  # a character whose lower case is longer (U+0130): positions would shift
        return prose, [m.start() for m in re.finditer("answer", prose, re.I)]
    positions = []
    pos = lower.find("answer")
    while pos != -1:
        positions.append(pos)
        pos = lower.find("answer", pos + 6)
    return lower, positions


def _statements(prose: str) -> list[_Statement]:
    """``Answer: ...`` lines and "the (final) answer is ..." sentences, in text order.

    Both start at an occurrence of "answer", so only those places are examined: each line once for
    an answer line, each occurrence once for a statement.
    """
    lower, positions = _answer_positions(prose)
    found: list[_Statement] = []
    line_start, scanned, last_line = 0, 0, -1  # the line of the current occurrence, scanning each character once
    for pos in positions:
        newline = prose.rfind("\n", scanned, pos)
        if newline != -1:
            line_start = newline + 1
        scanned = pos
        if line_start != last_line:
            last_line = line_start
            line = _ANSWER_LINE.match(prose, line_start)
            if line is not None:
                found.append(_Statement(line_start, _clean_statement(line.group("ans").rstrip(" \t*_")), True))
                continue
        elif found and found[-1].start == line_start:
            continue  # "Answer is: 5" on its own line is already an answer line
        if pos and (lower[pos - 1].isalnum() or lower[pos - 1] == "_"):
            continue  # "...answer" inside a longer word
        midline = _MIDLINE_ANSWER.match(prose, pos)
        if midline is not None and _MIDLINE_LEAD.search(prose, max(line_start, pos - 40), pos) is not None:
            rest = midline.group("ans")
            end = _SENTENCE_END.search(rest)
            found.append(_Statement(pos, _clean_statement(rest[: end.start()] if end else rest), True))
            continue
        match = _ANSWER_STATEMENT.match(prose, pos)
        if match is None:
            continue
        rest = match.group("ans")
        end = _SENTENCE_END.search(rest)
        final = _FINAL_BEFORE.search(lower, max(0, pos - 30), pos) is not None
        found.append(_Statement(pos, _clean_statement(rest[: end.start()] if end else rest), final))
    return [s for s in found if s.answer]


def is_math_answer(answer: str) -> bool:
    """True when ``answer`` reads as a mathematical value rather than prose ("an integer", "not 5")."""
    bare = _LATEX_COMMAND.sub(" ", answer)
    return bool(answer.strip()) and len(answer) <= 200 and _PROSE_WORD.search(bare) is None


def bare_final_line(prose: str) -> str | None:
    """The value on the last non-empty line of ``prose`` when that line holds nothing else, else None.

    A careful grader reads a response that ends "...so the total is\\n\\n34" as answering 34; a number
    inside a sentence ("The result is 5") is not that, nor is a list marker ("2.") a response was cut at.
    """
    end = len(prose.rstrip())
    if not end:
        return None
    start = prose.rfind("\n", 0, end) + 1
    if end - start > MAX_BARE_CHARS + 8:
        return None
    line = prose[start:end].strip()
    value = _BARE_DECORATION.match(line)
    answer = value.group("value").strip() if value else line
    if not answer or _LIST_MARKER.match(answer) or _HAS_VALUE.search(answer) is None or not is_math_answer(answer):
        return None
    return answer.rstrip(".").strip() or None


def clip_response(text: str) -> str:
    """The last ``MAX_RESPONSE_CHARS`` of ``text``, minus a tool region whose opening tag was cut off."""
    if len(text) <= MAX_RESPONSE_CHARS:
        return text
    tail = text[-MAX_RESPONSE_CHARS:]
    first = _CLOSING_TOOL_TAG.search(tail)
    if first is not None and first.group(1):  # a closing tag before any opening one: its region began before the cut
        tail = tail[first.end() :]
    return tail


def extract_answer(text: str) -> str | None:
    """The model's final answer in a response, or None when it gave none (see module docstring)."""
    if not isinstance(text, str) or not text:
        return None
    text = clip_response(text)
    if any(ch in text for ch in _ZERO_WIDTH_CHARS):  # a few substring tests instead of a regex pass over every character
        text = _ZERO_WIDTH.sub("", text)
    prose = strip_tool_regions(text)
    statements = _statements(prose)
    boxed = _last_box(prose)
    if boxed is not None:
        answer, start = boxed
        corrections = [s for s in statements if s.start > start and "\\boxed" not in s.answer and is_math_answer(s.answer)]
        return corrections[-1].answer if corrections else answer
    tags = answer_tags(prose)
    if tags:
        return tags[-1]
    finals = [s.answer for s in statements if s.final]
    if finals:
        return finals[-1]
    if statements:
        return statements[-1].answer
    return bare_final_line(prose)


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
    "\u2205": "\\emptyset ",
}
_UNICODE_TABLE = str.maketrans(_UNICODE)
# Control characters, and invisible ones that split a number ("3\u200b4"): soft hyphen, zero-width
# spaces and joiners, direction marks, word joiner, byte-order mark.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u00ad\u200b-\u200f\u2060\ufeff]")
_VULGAR = {
    "\u00bd": (1, 2), "\u2153": (1, 3), "\u2154": (2, 3), "\u00bc": (1, 4), "\u00be": (3, 4), "\u2155": (1, 5),
    "\u2156": (2, 5), "\u2157": (3, 5), "\u2158": (4, 5), "\u2159": (1, 6), "\u215a": (5, 6), "\u2150": (1, 7),
    "\u215b": (1, 8), "\u215c": (3, 8), "\u215d": (5, 8), "\u215e": (7, 8), "\u2151": (1, 9), "\u2152": (1, 10),
}  # fmt: skip
_VULGAR_FRACTION = re.compile(f"(\\d*)[ \\t]*([{''.join(_VULGAR)}])")
_EMPTY_SET = re.compile(r"\\(?:varnothing|emptyset)(?![A-Za-z])|\\\{\s*\\\}")
_BRACKET_MATRIX = re.compile(r"\\(begin|end)\{bmatrix\}")
_ROW_END = re.compile(r"\\\\\s*(?=\\end\{pmatrix\})")

_TEXT_COMMANDS = re.compile(r"\\(?:text|textrm|textnormal|mbox|mathrm|textbf|mathbf|textit|mathit|operatorname)\s*\{")
# Words, or a compound unit written inside one group ("m/s", "km/h", "m/s^2", "m s^{-1}").
_UNIT_WORDS = re.compile(r"^[\sA-Za-z.]*(?:(?:/[\sA-Za-z.]*[A-Za-z]|\^\s*\{?\s*-?\d\s*\}?)[\sA-Za-z.]*)*$")
_UNIT_TAIL = re.compile(r"\s*(?:\^\s*\{?\s*-?\d\s*\}?|(?P<den>(?:/|\\cdot|\\,|\\ |~)?\s*\\(?:text|mathrm|mbox)\s*\{))")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b|\\textdegree\b|\s*degrees?\b\.?")
# Thin spaces and quads go; a matrix row break "\\\\" is kept (its second backslash is not "\\ ").
_SPACING = re.compile(r"\\\\|\\[!,;:> ]|~|\\quad\b|\\qquad\b")
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
# What a unit can follow: a number, a group, a parenthesis or a constant such as \pi ("36\pi \text{ cm}^2").
_UNIT_FOLLOWS = re.compile(r"(?:\d|\}|\)|\\[A-Za-z]+)(?:\s|\\[,;: ]|~)*$")
# Unit symbols a compound unit is written with in plain text ("3 m/s", "60 km/h", "9.8 m/s^2"): a
# closed list, so that "3 a/b" (three a over b) is never read as 3 with a unit.
_UNIT_SYMBOLS = (
    "m|s|km|cm|mm|nm|h|hr|hrs|min|mins|sec|secs|kg|g|mg|L|l|mL|ml|ft|mi|yd|lb|lbs|oz|N|J|W|kW|Pa|kPa|K|mol|"
    "day|days|hour|hours|minute|minutes|second|seconds|meter|meters|metre|metres|mile|miles|gal|rev|rad"
)
_UNIT_POWER = r"(?:\^\{?-?\d\}?)?"
_COMPOUND_UNIT = re.compile(
    rf"^([+-]?[\d.]+(?:/\d+)?)\s*(?:{_UNIT_SYMBOLS}){_UNIT_POWER}(?:\s*(?:/|\\cdot|\*|\s)\s*(?:{_UNIT_SYMBOLS}){_UNIT_POWER})*\s*/\s*(?:{_UNIT_SYMBOLS}){_UNIT_POWER}$"
)


def _vulgar(match: re.Match[str]) -> str:
    """``½`` -> ``\\frac{1}{2}``; a mixed number ``2½`` -> ``\\frac{5}{2}``."""
    whole, (num, den) = match.group(1), _VULGAR[match.group(2)]
    if whole:
        num += int(whole[-_MAX_DIGITS:]) * den
    return f"\\frac{{{num}}}{{{den}}}"


def _replace_text_commands(s: str) -> str:
    """Unwrap ``\\text{...}``-like groups; drop them when they are a unit ending the answer.

    A unit is words after a number, a group or a constant, with nothing but its own power or
    denominator after it: ``1 \\text{ or } 2`` keeps its words (it is not ``12``).
    """
    pairs = brace_pairs(s)
    out: list[str] = []
    emitted = ""  # the last characters emitted so far, to see what a group follows
    pos = 0
    for match in _TEXT_COMMANDS.finditer(s):
        if match.start() < pos:
            continue
        close = pairs.get(match.end() - 1)
        if close is None:
            continue
        content, end = s[match.end() : close], close + 1
        before = s[pos : match.start()]
        emitted = (emitted + before)[-40:]
        is_unit = bool(content.strip()) and _UNIT_FOLLOWS.search(emitted) is not None and _UNIT_WORDS.match(content) is not None
        if is_unit:
            # a unit's power and a compound unit ("\\text{ cm}^2", "\\text{m}/\\text{s}") go with it
            unit_end = end
            while tail := _UNIT_TAIL.match(s, unit_end):
                if tail.group("den"):
                    next_close = pairs.get(tail.end() - 1)
                    if next_close is None or _UNIT_WORDS.match(s[tail.end() : next_close]) is None:
                        break
                    unit_end = next_close + 1
                else:
                    unit_end = tail.end()
            is_unit = not s[unit_end:].strip(" .")
            if is_unit:
                end = unit_end
        out.append(before)
        replacement = " " if is_unit else content
        out.append(replacement)
        emitted = (emitted + replacement)[-40:]
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
    s = _CONTROL.sub("", answer)
    s = _VULGAR_FRACTION.sub(_vulgar, s).translate(_UNICODE_TABLE).strip()
    s = s.replace("\\$", "").replace("$", "")  # math delimiters and escaped currency signs
    s = re.sub(r"\\[()\[\]]", "", s)
    s = _DROPPED.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _replace_text_commands(s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",")
    s = _SPACING.sub(lambda m: m.group() if m.group() == "\\\\" else "", s)
    s = _EMPTY_SET.sub(r"\\emptyset ", s)
    s = _ROW_END.sub("", _BRACKET_MATRIX.sub(r"\\\1{pmatrix}", s))
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF.sub(r"\\frac{\1}{", s)
    s = _FRAC_HALF2.sub(r"\\frac\1{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _WHITESPACE.sub(" ", s).strip()
    s = strip_trailing_remark(s)
    s = _strip_outer_braces(s)
    if s.count("=") == 1:
        s = _ASSIGNMENT.sub("", s)
    s = s.rstrip(".").strip()
    unit = _TRAILING_UNIT.match(s) or _COMPOUND_UNIT.match(s)
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
_REPEATING = re.compile(r"^([+-]?)(\d*)\.(\d*)\\overline\{(\d+)\}$")
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
    match = _REPEATING.match(s)
    if match:  # 0.1\overline{6} = 0.1 + 6/90: exact, like the fraction it stands for
        sign, whole, fixed, period = match.groups()
        value = int(whole or "0") + Fraction(int(fixed or "0"), 10 ** len(fixed)) + Fraction(int(period), 10 ** len(fixed) * (10 ** len(period) - 1))
        return Number(-value if sign == "-" else value)
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
