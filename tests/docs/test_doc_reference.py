"""docs/recipe.md, docs/operations.md and docs/sandbox.md against the code they describe.

These pages are reference material: settings, flags, exit codes, metric names. Their commands need
data, models or a cluster, so they are not run (test_doc_commands runs the ones that can be);
instead everything the pages state that the code decides is read back from the code:

- the operator's settings table is ``OperatorConfig`` and the sandbox's is ``SandboxSettings``:
  every field has a row, every row a field, and the documented default is the field's default;
- every ``RETOOL_*`` variable the docs name is a settings field or is read by the code;
- every ``retool ...`` / ``python -m retool...`` command in them names a real (sub)command and
  only its flags, and every ``--flag`` quoted in a section about a command is one of its flags;
- the preflight's checks and exit codes are ``retool.preflight.checks.CHECKS``, in order;
- the sandbox's ``/metrics`` names are the ones the server exports, all of them.

A command of a program with no check here fails the test: a new one needs a line in ``FOREIGN``
(another project's program) or a way to read its flags.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from functools import cache

import pytest
from pydantic_settings import BaseSettings

from retool.cli import build_parser
from retool.preflight.checks import CHECKS
from retool.sandbox.metrics import SandboxMetrics
from retool.sandbox.settings import SandboxSettings
from retool_operator.config import OperatorConfig
from tests.conftest import REPO, repo_env

DOCS = ["docs/recipe.md", "docs/operations.md", "docs/sandbox.md"]
FOREIGN = {"kopf", "kubectl", "vllm", "curl", "helm", "docker", "make", "verl", "torch", "mlflow"}
"""Programs (and Python packages) of other projects, and make, whose targets test_doc_commands checks: not read here."""
PASS_THROUGH = {"retool.runtime.cpu_only"}
"""Modules run as ``python -m WRAPPER -m MODULE ARGS``: the arguments are MODULE's."""
CODE_DIRS = ["retool", "operator", "charts", "images"]
SECTIONS: list[tuple[str, str, list[str]]] = [
    ("docs/recipe.md", "## Data preparation", ["retool data prepare sft", "retool data prepare rl", "retool data prepare eval", "retool data prepare all"]),
    ("docs/recipe.md", "## Stage commands", ["retool render", "python -m retool.stage"]),
    ("docs/recipe.md", "## Preflight", ["retool preflight", "python -m retool.preflight"]),
    ("docs/recipe.md", "### Checkpoint storage", ["retool storage upload", "retool storage download"]),
    ("docs/recipe.md", "## Evaluating a served model", ["retool eval"]),
    ("docs/recipe.md", "## Checking SFT data", ["retool data check"]),
    ("docs/sandbox.md", "# Code sandbox", ["retool sandbox serve", "python -m retool.sandbox", "python bench/sandbox_bench.py", "python bench/sandbox_compare.py"]),
]
"""Sections about a command (to the next heading of the same or a higher level) and its programs."""

DESCRIBED_DEFAULTS = {
    "queue_size": "4 × workers",
    "landlock_max_abi": "kernel's",
    "runtime_class": "—",
    "tmp_root": "system temp dir",
    "preload": "math stack + stdlib",
    "pod_name": "`$HOSTNAME`",
}
"""SandboxSettings defaults computed at start: the words the table uses for them."""


def text(doc: str) -> str:
    return (REPO / doc).read_text()


# ---------------------------------------------------------------------------------- settings tables


def table_rows(doc: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with ``header``."""
    lines = text(doc).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"{doc}: no table starting {header!r}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def documented_settings(doc: str, header: str) -> dict[str, str]:
    """Variable (without its prefix) -> documented default; ``A`` / ``B`` rows give one default each."""
    out: dict[str, str] = {}
    for names_cell, default_cell, *_ in table_rows(doc, header):
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", names_cell)
        default_cell = re.sub(r"\s*\((chart|default)[^)]*\)", "", default_cell)  # "(chart: ...)": the chart's value, not the code's
        defaults = [d.strip() for d in default_cell.split(" / ")]
        defaults = defaults * len(names) if len(defaults) == 1 else defaults  # one default for every variable of the row
        assert names and len(defaults) == len(names), f"{doc}: row {names_cell} | {default_cell}: one default, or one per variable"
        for name, default in zip(names, defaults, strict=True):
            assert name not in out, f"{doc}: {name} documented twice"
            out[name] = default
    return out


UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def documented_value(cell: str, default: object) -> object:
    """The documented default read as the field's type (``empty`` is the empty string, ``unset`` no value)."""
    value = cell.strip().strip("`")
    if value == "empty":
        return ""
    if value == "unset":
        return None
    if isinstance(default, bool):
        return {"true": True, "false": False}.get(value, value)
    if isinstance(default, int | float):
        number = re.fullmatch(r"([0-9.]+)(?:\s*(KiB|MiB|GiB))?", value)
        return float(number.group(1)) * UNITS.get(number.group(2) or "", 1) if number else value
    if isinstance(default, tuple):
        return tuple(v.strip() for v in value.split(","))
    return value


def check_settings_table(settings: type[BaseSettings], doc: str, header: str, described: dict[str, str]) -> None:
    documented = documented_settings(doc, header)
    fields = {name.upper(): field for name, field in settings.model_fields.items()}
    assert sorted(set(fields) - set(documented)) == [], f"{doc}: settings of {settings.__name__} missing from the table"
    assert sorted(set(documented) - set(fields)) == [], f"{doc}: the table documents variables {settings.__name__} does not have"
    for name, field in fields.items():
        if name.lower() in described:
            assert documented[name] == described[name.lower()], f"{doc}: {name}'s default, computed at start, is described as {described[name.lower()]!r}"
            continue
        default = field.get_default(call_default_factory=False)
        assert documented_value(documented[name], default) == default, f"{doc}: {name} defaults to {default!r}, the table says {documented[name]!r}"


def test_the_operator_settings_table_is_operator_config() -> None:
    check_settings_table(OperatorConfig, "docs/operations.md", "| variable (`RETOOL_OPERATOR_`", {})


def test_the_sandbox_settings_table_is_sandbox_settings() -> None:
    check_settings_table(SandboxSettings, "docs/sandbox.md", "| variable | default | meaning |", DESCRIBED_DEFAULTS)


@pytest.mark.parametrize(
    ("cell", "default", "value"),
    [
        ("`true`", True, True),
        ("`retool/sandbox:0.1.0`", "retool/sandbox:0.1.0", "retool/sandbox:0.1.0"),
        ("empty", "", ""),
        ("16 MiB", 16 << 20, float(16 << 20)),
        ("PATH, LANG", ("PATH", "LANG"), ("PATH", "LANG")),
        ("`30`", 30.0, 30.0),
        ("thirty", 30.0, "thirty"),
    ],
    ids=["a boolean", "a string", "empty is the empty string", "a size in MiB", "a list", "a number", "words stay words (and differ)"],
)
def test_documented_value(cell: str, default: object, value: object) -> None:
    assert documented_value(cell, default) == value


# ------------------------------------------------------------------------------------- variables


@cache
def code_text() -> str:
    files = (p for d in CODE_DIRS for p in (REPO / d).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".tpl", ".txt", ".sh", "") and "__pycache__" not in p.parts)
    return "\n".join(p.read_text(errors="replace") for p in files)


def documented_variables() -> list[tuple[str, str]]:
    found = {(doc, name) for doc in [*DOCS, "docs/retoolrun.md", "docs/install.md", "README.md"] for name in re.findall(r"\bRETOOL_[A-Z0-9_]*[A-Z0-9]\b", text(doc))}
    return sorted(found)


@pytest.mark.parametrize(("doc", "name"), documented_variables(), ids=lambda v: v)
def test_every_variable_the_docs_name_is_read_by_the_code(doc: str, name: str) -> None:
    for prefix, settings in (("RETOOL_OPERATOR_", OperatorConfig), ("RETOOL_SANDBOX_", SandboxSettings)):
        if name.startswith(prefix) and name.removeprefix(prefix).lower() in settings.model_fields:
            return
    assert re.search(rf"\b{name}\b", code_text()), f"{doc} names {name}, which nothing under {', '.join(CODE_DIRS)} reads"


# -------------------------------------------------------------------------------------- commands


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})  # type: ignore[return-value]


@cache
def help_flags(program: str) -> frozenset[str]:
    """Flags of ``python -m module`` or ``python script.py``, read from its --help."""
    argv = [sys.executable, *program.split()[1:], "--help"]
    proc = subprocess.run(argv, cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{program} --help: {proc.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", proc.stdout))


def program_of(words: list[str]) -> tuple[str, frozenset[str], list[str]]:
    """(program as the SECTIONS name it, its flags, the words after it) of a command line; a
    program given without flags is not asked for them (``python -m retool_operator`` starts the
    operator)."""
    if words[0] == "retool":
        parser, path, rest = build_parser(), ["retool"], words[1:]
        while (choices := _subcommands(parser)) and rest and not rest[0].startswith("-"):
            assert rest[0] in choices, f"`{' '.join(path)}` has no subcommand {rest[0]!r} (it has {sorted(choices)})"
            parser, path, rest = choices[rest[0]], [*path, rest[0]], rest[1:]
        return " ".join(path), frozenset(s for a in parser._actions for s in a.option_strings), rest
    if words[0] in ("python", "python3") and words[1] == "-m":
        if words[2] == "retool.cli":
            return program_of(["retool", *words[3:]])
        if words[2] in PASS_THROUGH and words[3:4] == ["-m"]:  # the wrapped module's own arguments follow
            return program_of(["python", "-m", *words[4:]])
        if not words[2].startswith("retool"):
            return words[2].split(".")[0], frozenset(), words[3:]  # another project's module (verl, ...)
        program = f"python -m {words[2]}"
        return program, help_flags(program) if flags_in(words[3:]) else frozenset(), words[3:]
    if words[0] in ("python", "python3") and words[1].endswith(".py"):
        assert (REPO / words[1]).is_file(), f"no script {words[1]}"
        program = f"python {words[1]}"
        return program, help_flags(program) if flags_in(words[2:]) else frozenset(), words[2:]
    return words[0], frozenset(), words[1:]


def flags_in(words: list[str]) -> list[str]:
    """The flags among a command's words, up to ``--`` (what follows it is another program's)."""
    words = words[: words.index("--")] if "--" in words else words
    return [w.strip("[]").split("=", 1)[0] for w in words if w.strip("[]").startswith("-") and w != "-"]


def command_lines(doc: str) -> Iterator[str]:
    """Lines of the ```bash blocks (continuations joined, comments cut) and inline `retool ...` /
    `python -m ...` spans."""
    body = text(doc)
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                yield line
    for span in re.findall(r"`([^`\n]+)`", body):
        if re.match(r"(retool|python3? -m [\w.]+|python3? \S+\.py)( |$)", span):
            yield span


COMMANDS = sorted({(doc, line) for doc in DOCS for line in command_lines(doc)})


def test_the_reference_docs_have_commands() -> None:
    assert {doc for doc, _ in COMMANDS} == set(DOCS)
    assert len(COMMANDS) > 30


@pytest.mark.parametrize(("doc", "line"), COMMANDS, ids=[f"{doc}: {line[:70]}" for doc, line in COMMANDS])
def test_command_names_real_commands_and_flags(doc: str, line: str) -> None:
    words = shlex.split(line.replace("&", " "), comments=True)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    program, flags, rest = program_of(words)
    if program.split()[0] in FOREIGN:
        return
    assert program.startswith(("retool", "python")), f"{doc}: no check for {program} commands: `{line}`"
    unknown = [f for f in flags_in(rest) if f not in flags]
    assert unknown == [], f"{doc}: `{line}`: {program} has no flag {unknown}"


def section(doc: str, heading: str) -> str:
    lines = text(doc).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    assert start is not None, f"{doc}: no section {heading!r}"
    level = len(heading.split(" ", 1)[0])
    end = next((i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize(("doc", "heading", "programs"), SECTIONS, ids=[f"{d}: {h}" for d, h, _ in SECTIONS])
def test_flags_quoted_in_a_command_section_are_the_commands(doc: str, heading: str, programs: list[str]) -> None:
    prose = re.sub(r"```.*?```", "", section(doc, heading), flags=re.S)  # command blocks: test_command_names_real_commands_and_flags
    known: set[str] = set()
    for program in programs:
        known |= program_of(program.split())[1] if program.startswith("retool") else help_flags(program)
    # spans that start with a flag; a span that starts with a program is a command (checked above, or another project's)
    quoted = [f for span in re.findall(r"`(--[^`\n]+)`", prose) for f in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", span)]
    assert quoted, f"{doc} {heading}: quotes no flag (is the section still about {programs}?)"
    unknown = sorted({f for f in quoted if f not in known})
    assert unknown == [], f"{doc} {heading}: quotes flags none of {programs} has: {unknown}"


# ------------------------------------------------------------------------------ exit codes, metrics


def test_the_preflight_checks_and_exit_codes_are_the_code() -> None:
    rows = table_rows("docs/recipe.md", "| check | exit |")
    assert [(name.strip("`"), int(code)) for name, code, *_ in rows] == [(c.name, c.exit_code) for c in CHECKS]


def test_the_sandbox_metrics_are_the_ones_it_exports() -> None:
    families = list(SandboxMetrics().registry.collect())
    exported = {f.name for f in families} | {f"{f.name}_total" for f in families if f.type == "counter"}
    documented = set(re.findall(r"\bretool_sandbox_[a-z_]+[a-z]\b", text("docs/sandbox.md")))
    assert sorted(documented - exported) == [], "docs/sandbox.md names metrics the server does not export"
    undocumented = sorted(f.name for f in families if not ({f.name, f"{f.name}_total"} & documented))
    assert undocumented == [], "metrics the sandbox exports that docs/sandbox.md does not list"
