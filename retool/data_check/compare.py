"""Does what the sandbox printed for a code block agree with what the trajectory recorded?

Verdicts, from strictest to loosest, all pure functions of two strings:
- ``match``: equal once line endings and trailing whitespace are normalised;
- ``numeric_match``: the same text around numbers that agree to a relative 1e-6 (float printing
  differs across numpy/sympy versions without changing what the model learns);
- ``error_match``: both are errors ending in the same exception line (tracebacks name files and
  lines that differ between sandboxes);
- ``mismatch``: anything else; ``not_recorded``: the data holds no output for this code.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

MATCH = "match"
NUMERIC_MATCH = "numeric_match"
ERROR_MATCH = "error_match"
MISMATCH = "mismatch"
NOT_RECORDED = "not_recorded"
AGREEING = frozenset({MATCH, NUMERIC_MATCH, ERROR_MATCH})

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|[A-Z]\w*Error)\b.*$")


@dataclass(frozen=True)
class Comparison:
    verdict: str
    similarity: float
    diff: str = ""


def normalise(text: str) -> str:
    """Line endings unified, trailing whitespace of each line and surrounding blank lines removed."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def numbers_agree(expected: str, actual: str, rel_tol: float = 1e-6) -> bool:
    """Same text around the numbers, and every pair of numbers equal to ``rel_tol``."""
    if NUMBER.sub("#", expected) != NUMBER.sub("#", actual):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-12) for a, b in zip(NUMBER.findall(expected), NUMBER.findall(actual), strict=True))


def final_exception(text: str) -> str | None:
    """The last line that names an exception (``NameError: name 'x' is not defined``), if any."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if EXCEPTION_LINE.match(line):
            return line
    return None


def compare_output(recorded: str | None, actual: str) -> Comparison:
    """The verdict for one code block, with a similarity ratio and a short diff when they differ."""
    if recorded is None:
        return Comparison(NOT_RECORDED, 0.0)
    expected, got = normalise(recorded), normalise(actual)
    if expected == got:
        return Comparison(MATCH, 1.0)
    similarity = difflib.SequenceMatcher(None, expected, got, autojunk=False).ratio()
    if numbers_agree(expected, got):
        return Comparison(NUMERIC_MATCH, similarity)
    expected_error, actual_error = final_exception(expected), final_exception(got)
    if expected_error is not None and expected_error == actual_error:
        return Comparison(ERROR_MATCH, similarity)
    diff = "\n".join(difflib.unified_diff(expected.splitlines(), got.splitlines(), "recorded", "sandbox", n=1, lineterm=""))
    return Comparison(MISMATCH, similarity, diff[:2000])
