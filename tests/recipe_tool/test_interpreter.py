"""Tables for the tool's pure parts: code extraction, trailing-expression printing, tracebacks, truncation, texts."""

from __future__ import annotations

import contextlib
import io

import pytest

from retool.recipe.tool.interpreter import (
    NO_OUTPUT,
    RESULT_NAME,
    extract_code,
    format_run,
    print_trailing_expression,
    restore_source_in_traceback,
    trim_traceback,
    truncate_middle,
)

EXTRACT = [
    ("plain code is kept", "print(1)", "print(1)"),
    ("python fence", "Let me compute:\n```python\nx = 2\nprint(x)\n```\nDone", "x = 2\nprint(x)"),
    ("first of two fences", "```python\na = 1\n```\n```python\nb = 2\n```", "a = 1"),
    ("py tag", "```py\nprint(3)\n```", "print(3)"),
    ("untagged fence", "```\nprint(4)\n```", "print(4)"),
    ("unclosed fence runs to the end", "```python\nprint(5)\n", "print(5)"),
    ("fence in the middle of a line is not a fence start", "x = '```'", "x = '```'"),
]


@pytest.mark.parametrize(("argument", "code"), [c[1:] for c in EXTRACT], ids=[c[0] for c in EXTRACT])
def test_extract_code(argument: str, code: str) -> None:
    assert extract_code(argument) == code


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<test>", "exec"), {})
    return out.getvalue()


PRINTS = [
    ("bare name after an assignment", "x = 6 * 7\nx", "42\n"),
    ("arithmetic expression", "2 ** 10", "1024\n"),
    ("call that returns a value", "def f(n):\n    return n + 1\nf(2)", "3\n"),
    ("tuple without parentheses", "a, b = 1, 2\na, b", "(1, 2)\n"),
    ("expression after a semicolon", "x = 5; x", "5\n"),
    ("expression with a trailing comment", "x = 5\nx  # the answer", "5\n"),
    ("multi-line call", "max(\n    3,\n    4,\n)", "4\n"),
    ("trailing comments and blank lines", "y = 9\ny\n\n# done\n", "9\n"),
    ("non-ascii identifiers keep their columns", "é = 'ü'; é + 'x'", "üx\n"),
    ("string literal", "'hello'", "hello\n"),
    ("sympy-like attribute access", "import fractions\nfractions.Fraction(1, 3) + fractions.Fraction(1, 6)", "1/2\n"),
    ("method call returning None prints nothing", "xs = [3, 1]\nxs.sort()", ""),
    ("function that prints and returns None prints once", "def main():\n    print('hi')\nmain()", "hi\n"),
]


@pytest.mark.parametrize(("code", "stdout"), [c[1:] for c in PRINTS], ids=[c[0] for c in PRINTS])
def test_trailing_expression_is_printed(code: str, stdout: str) -> None:
    rewritten = print_trailing_expression(code)
    assert RESULT_NAME in rewritten
    assert _run(rewritten) == stdout


UNCHANGED = [
    ("assignment", "x = 1"),
    ("augmented assignment", "x = 1\nx += 1"),
    ("annotated assignment", "x: int = 1"),
    ("print call", "x = 1\nprint(x)"),
    ("print call split over lines", "print(\n    1,\n    2,\n)"),
    ("pprint call", "from pprint import pprint\npprint({1: 2})"),
    ("sys.stdout.write", "import sys\nsys.stdout.write('a')"),
    ("indented last line of a loop", "for i in range(3):\n    i * 2"),
    ("indented last line of a function", "def f():\n    return 1\n    1 + 1"),
    ("if block", "if True:\n    5"),
    ("import statement", "import math"),
    ("pass statement", "x = 1\npass"),
    ("syntax error is left for the sandbox to report", "x = (1,\n"),
    ("empty code", ""),
    ("only a comment", "# nothing"),
    ("a last line starting with print is still parsed", "print_result = 3"),
    ("with block", "with open('f', 'w') as fh:\n    fh.write('x')"),
]


@pytest.mark.parametrize("code", [c[1] for c in UNCHANGED], ids=[c[0] for c in UNCHANGED])
def test_code_left_alone(code: str) -> None:
    assert print_trailing_expression(code) == code


TRACEBACK = """Traceback (most recent call last):
  File "/box/run-17/main.py", line 4, in <module>
    solve()
  File "/box/run-17/main.py", line 2, in solve
    return numpy.linalg.inv(m)
           ^^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.11/site-packages/numpy/linalg/linalg.py", line 561, in inv
    ainv = _umath_linalg.inv(a, signature=signature, extobj=extobj)
  File "/usr/local/lib/python3.11/site-packages/numpy/linalg/linalg.py", line 112, in _raise_linalgerror_singular
    raise LinAlgError("Singular matrix")
numpy.linalg.LinAlgError: Singular matrix
"""

TRIMMED = """Traceback (most recent call last):
  File "main.py", line 4, in <module>
    solve()
  File "main.py", line 2, in solve
    return numpy.linalg.inv(m)
           ^^^^^^^^^^^^^^^^^^^
  [2 library frames omitted]
numpy.linalg.LinAlgError: Singular matrix"""

CHAINED = """Traceback (most recent call last):
  File "/tmp/a/main.py", line 2, in <module>
    1 / 0
ZeroDivisionError: division by zero

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/tmp/a/main.py", line 4, in <module>
    raise ValueError("bad")
ValueError: bad
"""

SYNTAX = """  File "/tmp/a/main.py", line 1
    print(
         ^
SyntaxError: '(' was never closed
"""

TRACEBACKS = [
    ("library frames collapse and paths lose their temp dir", TRACEBACK, TRIMMED),
    ("warnings before a traceback are kept", "UserWarning: careful\n" + TRACEBACK, "UserWarning: careful\n" + TRIMMED),
    (
        "only the last of chained tracebacks",
        CHAINED,
        'Traceback (most recent call last):\n  File "main.py", line 4, in <module>\n    raise ValueError("bad")\nValueError: bad',
    ),
    ("syntax error without a traceback header is unchanged", SYNTAX, SYNTAX),
    ("plain stderr is unchanged", "some warning\n", "some warning\n"),
    (
        "frozen importlib frames are library frames",
        'Traceback (most recent call last):\n  File "/w/main.py", line 1, in <module>\n    import nope\n'
        '  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load\n'
        "ModuleNotFoundError: No module named 'nope'\n",
        'Traceback (most recent call last):\n  File "main.py", line 1, in <module>\n    import nope\n  [1 library frame omitted]\n'
        "ModuleNotFoundError: No module named 'nope'",
    ),
]


@pytest.mark.parametrize(("stderr", "expected"), [c[1:] for c in TRACEBACKS], ids=[c[0] for c in TRACEBACKS])
def test_trim_traceback(stderr: str, expected: str) -> None:
    assert trim_traceback(stderr) == expected


@pytest.mark.parametrize("size", [0, 10, 199, 200, 201, 1000, 100_000], ids=lambda n: f"{n} chars")
def test_truncate_middle_keeps_head_and_tail_within_the_limit(size: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(size))
    out = truncate_middle(text, 200)
    assert len(out) <= 200
    if size <= 200:
        assert out == text
    else:
        head, marker_and_tail = out.split("\n... [", 1)
        cut = int(marker_and_tail.split(" characters truncated] ...\n", 1)[0])
        tail = marker_and_tail.split(" characters truncated] ...\n", 1)[1]
        assert text.startswith(head) and text.endswith(tail)
        assert len(head) + len(tail) + cut == size


def _fmt(**overrides: object) -> str:
    fields = {
        "status": "Success",
        "run_status": "Finished",
        "stdout": "",
        "stderr": "",
        "return_code": 0,
        "message": "",
        "timeout_s": 30.0,
        "memory_limit_mb": 1024,
        "max_output_chars": 4096,
    }
    fields.update(overrides)
    return format_run(**fields)  # type: ignore[arg-type]


FORMATS = [
    ("stdout only", {"stdout": "42\n"}, "42"),
    ("no output at all", {}, NO_OUTPUT),
    ("stdout and a warning", {"stdout": "1\n", "stderr": "warn\n"}, "1\nwarn"),
    ("error exit with traceback", {"status": "Failed", "run_status": "Error", "return_code": 1, "stderr": TRACEBACK}, TRIMMED),
    (
        "timeout keeps partial output",
        {"status": "Failed", "run_status": "TimeLimitExceeded", "stdout": "step 1\n", "return_code": None},
        "step 1\nTimeoutError: the code ran longer than the 30 s time limit and was stopped.",
    ),
    (
        "killed by a signal",
        {"status": "Failed", "run_status": "Error", "return_code": -9},
        "The process was killed by signal 9 (it may have exceeded the 1024 MB memory limit).",
    ),
    ("silent non-zero exit", {"status": "Failed", "run_status": "Error", "return_code": 3}, "The process exited with code 3."),
    ("silent non-zero exit as SandboxFusion reports it", {"status": "Failed", "run_status": "Finished", "return_code": 3}, "The process exited with code 3."),
    (
        "signal death as SandboxFusion reports it",
        {"status": "Failed", "run_status": "Finished", "return_code": -11},
        "The process was killed by signal 11 (it may have exceeded the 1024 MB memory limit).",
    ),
    ("sandbox error", {"status": "SandboxError", "run_status": None, "message": "queue full"}, "Sandbox error: queue full"),
    ("failed before running", {"status": "Failed", "run_status": None, "message": ""}, "Sandbox error: the sandbox could not run the code"),
]


@pytest.mark.parametrize(("fields", "text"), [c[1:] for c in FORMATS], ids=[c[0] for c in FORMATS])
def test_format_run(fields: dict, text: str) -> None:
    assert _fmt(**fields) == text


def test_format_run_truncates_long_output() -> None:
    text = _fmt(stdout="x" * 10_000, max_output_chars=300)
    assert len(text) <= 300 and "characters truncated" in text


def _traceback_of(code: str) -> str:
    """The traceback CPython prints for ``code`` saved as main.py (what the sandbox returns)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "main.py").write_text(code)
        return subprocess.run([sys.executable, "main.py"], cwd=tmp, capture_output=True, text=True, check=False).stderr


RESTORE = [
    ("call that raises", "def f():\n    raise ValueError('x')\nf()"),
    ("subscript error under carets", "x = [1]\nx[0] + x[5]"),
    ("error after a semicolon", "x = 0; 1 / x"),
    ("multi-line expression", "d = {}\nmax(\n    d['missing'],\n    2,\n)"),
]


@pytest.mark.parametrize("code", [c[1] for c in RESTORE], ids=[c[0] for c in RESTORE])
def test_traceback_of_rewritten_code_reads_like_the_original(code: str) -> None:
    rewritten = print_trailing_expression(code)
    assert rewritten != code
    restored = trim_traceback(restore_source_in_traceback(_traceback_of(rewritten), code, rewritten))
    assert RESULT_NAME not in restored
    assert restored == trim_traceback(_traceback_of(code))


def test_docstring_examples_hold() -> None:
    import doctest

    import retool.recipe.tool.interpreter as interpreter

    result = doctest.testmod(interpreter)
    assert result.attempted > 0 and result.failed == 0
