"""Pure parts of the code-interpreter tool: what code to run, and what text the model reads back.

No I/O here (the tool in :mod:`retool.recipe.verl_plugins.tool` does the sandbox call), so every rule is
table-tested on plain strings:

- :func:`extract_code`: the first fenced python block of the argument, else the argument itself;
- :func:`print_trailing_expression`: print the value of a trailing bare expression, decided by
  ``ast`` (the public recipe's "last line does not start with print" rule rewrites assignments,
  indented lines and half of a multi-line call, and turns working code into a SyntaxError);
- :func:`trim_traceback`: keep the user's frames and the exception, drop library frames;
- :func:`truncate_middle`: keep head and tail around a marker;
- :func:`format_run`: stdout, stderr and the run's fate as one text.
"""

from __future__ import annotations

import ast
import re
from typing import Any

# The name that holds a trailing expression's value; unlikely to collide with the model's code.
RESULT_NAME = "_retool_last_value"

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
# Calls whose whole point is output; printing their (None) result would add noise.
_PRINTING_CALLS = frozenset({"print", "pprint", "display", "write", "writelines", "show", "savefig", "plot"})


def extract_code(argument: str) -> str:
    """The code to run: the first fenced python (or untagged) block when there is one."""
    match = _FENCE.search(argument)
    if match:
        return match.group(1).strip("\n")
    return argument


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def _char_offset(line: str, byte_offset: int) -> int:
    """ast reports columns in UTF-8 bytes; strings are indexed in characters."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def print_trailing_expression(code: str) -> str:
    """Make a trailing bare expression print its value, like a notebook cell; else return ``code``.

    Only the last top-level statement is considered, and only when it is an expression that is not
    a printing call (``print``, ``pprint``, ``display``, ``sys.stdout.write``, ``plt.show``...). The
    value is printed only when it is not None, so ``main()`` that prints and returns None adds nothing.
    Assignments, statements, and a last line that belongs to a block (indented) are left alone;
    code that does not parse is returned unchanged so that the sandbox reports the SyntaxError.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1].value
    if _call_name(node) in _PRINTING_CALLS or isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom)):
        return code
    if node.end_lineno is None or node.end_col_offset is None:
        return code
    lines = code.splitlines(keepends=True)
    first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
    start = sum(len(x) for x in lines[: node.lineno - 1]) + _char_offset(first, node.col_offset)
    end = sum(len(x) for x in lines[: node.end_lineno - 1]) + _char_offset(last, node.end_col_offset)
    line_end = code.find("\n", end)
    line_end = len(code) if line_end == -1 else line_end
    rewritten = (
        f"{code[:start]}{RESULT_NAME} = ({code[start:end]}){code[end:line_end]}\n"
        f"if {RESULT_NAME} is not None:\n    print({RESULT_NAME})\n{code[line_end + 1 :]}"
    )
    try:
        ast.parse(rewritten)
    except SyntaxError:
        return code
    return rewritten


_CARETS = re.compile(r"^ *[\^~]+[\^~ ]*$")


def restore_source_in_traceback(stderr: str, original: str, rewritten: str) -> str:
    """Show the model its own line where a traceback quotes the line :func:`print_trailing_expression` rewrote.

    Without this an error in ``f()`` would be reported on ``_retool_last_value = (f())``: code the
    model never wrote. Line numbers already agree (the rewrite only appends lines); the caret line
    under a restored line is shifted back by the removed prefix.
    """
    if original == rewritten or not stderr:
        return stderr
    prefix = f"{RESULT_NAME} = ("
    changed: dict[str, str] = {}
    for old, new in zip(original.splitlines(), rewritten.splitlines(), strict=False):
        if old != new:
            changed[new.strip()] = old.strip()
    if not changed:
        return stderr
    lines = stderr.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        shown = line.strip()
        if line.startswith("    ") and shown in changed:
            out.append("    " + changed[shown])
            at = shown.find(prefix)
            if i + 1 < len(lines) and _CARETS.match(lines[i + 1]):
                carets = lines[i + 1][4:]
                if at != -1 and not carets[at : at + len(prefix)].strip():
                    shifted = carets[:at] + carets[at + len(prefix) :]
                    # Python prints no carets when they would underline the whole line
                    if len(shifted) - len(shifted.lstrip()) > 0 or len(shifted.rstrip()) < len(changed[shown]):
                        out.append("    " + shifted)
                elif at == -1:
                    out.append(lines[i + 1])
                i += 1  # a caret line that pointed into the prefix is dropped
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


# --- what the model reads back -----------------------------------------------------------------

_TRACEBACK_HEAD = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line (?P<line>\d+)(?:, in (?P<name>.*))?$')
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|^<frozen |^<string>$|/usr/lib/")


def _is_library(path: str) -> bool:
    return _LIBRARY_PATH.search(path) is not None


def trim_traceback(stderr: str) -> str:
    """The part of a traceback that helps the model: its own frames and the exception.

    Library frames (site-packages, the standard library, frozen modules) are replaced by one
    "[N library frames omitted]" line, the paths of the model's file lose their temporary
    directory, and of chained exceptions only the last traceback is kept. Text before the
    traceback (warnings, output on stderr) is kept. Anything that is not a traceback is unchanged.
    """
    head = stderr.rfind(_TRACEBACK_HEAD)
    if head == -1:
        return stderr
    before = stderr[:head]
    chained = [m.start() for m in re.finditer(r"\n\s*(?:During handling of the above exception|The above exception was the direct cause)", before)]
    if chained:
        first = before.find(_TRACEBACK_HEAD)
        before = before[:first] if first != -1 else before[: chained[0]]
    lines = stderr[head:].splitlines()
    out = [_TRACEBACK_HEAD]
    omitted = 0
    i = 1
    frames_end = len(lines)
    while i < len(lines):
        frame = _FRAME.match(lines[i])
        if frame is None:
            if lines[i].startswith("    ") or not lines[i].strip():
                i += 1  # source or caret lines of a frame already handled
                continue
            frames_end = i
            break
        body = []
        i += 1
        while i < len(lines) and lines[i].startswith("    ") and _FRAME.match(lines[i]) is None:
            body.append(lines[i])
            i += 1
        path = frame.group("path")
        if _is_library(path):
            omitted += 1
            continue
        if omitted:
            out.append(f"  [{omitted} library frame{'s' if omitted > 1 else ''} omitted]")
            omitted = 0
        name = path.rsplit("/", 1)[-1]
        where = f', in {frame.group("name")}' if frame.group("name") else ""
        out.append(f'  File "{name}", line {frame.group("line")}{where}')
        out.extend(body)
    if omitted:
        out.append(f"  [{omitted} library frame{'s' if omitted > 1 else ''} omitted]")
    out.extend(lines[frames_end:])
    return before + "\n".join(out)


def truncate_middle(text: str, max_chars: int) -> str:
    """``text`` if it fits, else its head and tail around a marker saying how much was cut; fits ``max_chars``."""
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    while True:
        marker = f"\n... [{cut} characters truncated] ...\n"
        keep = max_chars - len(marker)
        if keep <= 0:
            return text[:max_chars]
        if len(text) - keep == cut:
            break
        cut = len(text) - keep
    head = keep // 2
    tail = keep - head
    return text[:head] + marker + text[len(text) - tail :]


NO_OUTPUT = "(no output; print the values you want to see)"


def format_run(
    *,
    status: str,
    run_status: str | None,
    stdout: str,
    stderr: str,
    return_code: int | None,
    message: str,
    timeout_s: float,
    memory_limit_mb: int,
    max_output_chars: int,
) -> str:
    """The text the model reads for one sandbox answer (see the sandbox's RunCodeResponse).

    ``status`` is the request's outcome (Success / Failed / SandboxError), ``run_status`` the
    program's (Finished / Error / TimeLimitExceeded, None when it never ran).
    """
    if status == "SandboxError" or (status != "Success" and run_status is None):
        return truncate_middle(f"Sandbox error: {message or 'the sandbox could not run the code'}", max_chars=max_output_chars)
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    err = trim_traceback(stderr).rstrip("\n") if stderr.strip() else ""
    if err:
        parts.append(err)
    if run_status == "TimeLimitExceeded":
        parts.append(f"TimeoutError: the code ran longer than the {timeout_s:g} s time limit and was stopped.")
    elif not err and (run_status == "Error" or (status != "Success" and return_code not in (0, None))):
        # SandboxFusion semantics: Finished with a non-zero return code is a program that failed
        # on its own (sys.exit(3), a signal); Error is the sandbox failing around it.
        if return_code is not None and return_code < 0:
            parts.append(f"The process was killed by signal {-return_code} (it may have exceeded the {memory_limit_mb} MB memory limit).")
        else:
            parts.append(f"The process exited with code {return_code}.")
    text = "\n".join(parts) if parts else NO_OUTPUT
    return truncate_middle(text, max_chars=max_output_chars)


def describe_sandbox_failure(status: str, message: str, *, deadline_s: float) -> str:
    """What the model reads when the sandbox did not run its code at all (``status``: overloaded,
    unavailable or sandbox_error). The same words in RL rollouts and in ``retool eval``, so an
    evaluated model meets what it was trained on.

    >>> describe_sandbox_failure("overloaded", "429", deadline_s=120)
    'Sandbox error: the code interpreter is overloaded and did not run the code within 120 s; try again.'
    """
    if status == "overloaded":
        return f"Sandbox error: the code interpreter is overloaded and did not run the code within {deadline_s:g} s; try again."
    if status == "unavailable":
        return f"Sandbox error: the code interpreter is unreachable and did not run the code within {deadline_s:g} s; try again."
    return f"Sandbox error: {message or 'the sandbox could not run the code'}"


def describe_response(response: Any, *, original: str, code: str, timeout_s: float, memory_limit_mb: int, max_output_chars: int) -> tuple[str, str]:
    """What the model reads for one sandbox answer, and the outcome name counted in metrics.

    ``response`` is a ``retool.sandbox.api.RunCodeResponse``; ``original`` is the model's code and
    ``code`` what was run (with the trailing-expression print), so tracebacks quote the model's own
    line. The RL tool and ``retool eval`` both answer the model through this one function.
    """
    run = response.run_result
    text = format_run(
        status=response.status,
        run_status=run.status if run else None,
        stdout=(run.stdout or "") if run else "",
        stderr=restore_source_in_traceback(run.stderr or "", original, code) if run else "",
        return_code=run.return_code if run else None,
        message=response.message,
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        max_output_chars=max_output_chars,
    )
    outcome = {"Success": "ok", "Failed": "code_failed"}.get(response.status, "sandbox_error")
    if run is not None and run.status == "TimeLimitExceeded":
        outcome = "timeout"
    return text, outcome
