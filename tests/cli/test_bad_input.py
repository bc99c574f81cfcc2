"""Every ``retool`` command, on a corpus of bad inputs, answers with one line naming what is wrong
and an exit status docs/cli.md documents for it, never a traceback.

The commands are enumerated from the CLI's own argparse parser (``retool.cli.leaf_commands``), and
the argument that takes the user's file is found by its name, so a new command is run on the
corpus without editing this file; a required argument this file cannot fill fails the test until
``FILLERS`` gets a value for it. Each case runs ``python -m retool.cli`` in a subprocess, as a user
(or a CI job) runs it.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from retool.cli import build_parser, leaf_commands
from tests.conftest import REPO, repo_env

pytestmark = pytest.mark.slow

MINIMAL = yaml.safe_load((REPO / "examples/retoolrun-minimal.yaml").read_text())


def run_with(**spec: object) -> str:
    """The minimal example with ``spec`` sections merged in, as YAML."""
    document = {**MINIMAL, "spec": {**MINIMAL["spec"], **spec}}
    return yaml.safe_dump(document)


@dataclass(frozen=True)
class Bad:
    """One bad input: how to make it under a folder, and what the message must name (the path by default)."""

    make: Callable[[Path], Path]
    names: Callable[[Path], str] = str


def text(name: str, content: str | bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    return make


def missing(name: str) -> Callable[[Path], Path]:
    return lambda folder: folder / "absent" / name


def directory(folder: Path) -> Path:
    path = folder / "a-folder"
    path.mkdir()
    return path


BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00"

RUN_FILES = {
    "a missing file": Bad(missing("run.yaml")),
    "a directory": Bad(directory),
    "an empty file": Bad(text("empty.yaml", "")),
    "a file holding only a comment": Bad(text("comment.yaml", "# a RetoolRun will go here\n")),
    "a YAML syntax error": Bad(text("syntax.yaml", "apiVersion: retool.dev/v1alpha1\nkind: RetoolRun\nmetadata: {name: broken\nspec: {}\n")),
    "a binary file": Bad(text("binary.yaml", BINARY)),
    "a list instead of a run": Bad(text("list.yaml", "- 1\n- 2\n")),
    "a second document that is not a run": Bad(text("two.yaml", run_with() + "---\nkind: RetoolRun\nspec: {}\n")),
    "a string where an integer belongs": Bad(text("types.yaml", run_with(hardware={"accelerator": "nvidia", "nodes": "2"}))),
    "an unknown field": Bad(text("unknown.yaml", run_with(rl={"batchSzie": 512}))),
    "a broken cross-field rule": Bad(text("rule.yaml", run_with(rl={"tensorParallel": 3}))),
}
"""RetoolRun files a user gets wrong."""

REFUSED_BY_THE_OPERATOR = {
    "gang scheduling without a batch scheduler": Bad(text("gang.yaml", (REPO / "examples/retoolrun-qwen32b-volcano.yaml").read_text())),
}
"""Valid runs the chart's default operator refuses: for commands that take the operator's settings."""

DATA_FILES = {
    "a missing file": Bad(missing("rows.jsonl")),
    "an empty jsonl file": Bad(text("empty.jsonl", "")),
    "an empty parquet file": Bad(text("empty.parquet", "")),
    "a text file named parquet": Bad(text("text.parquet", "problem,answer\n1+1,2\n")),
    "a line that is not JSON": Bad(text("broken.jsonl", '{"problem": "1+1", "answer":\n')),
    "a binary jsonl file": Bad(text("binary.jsonl", BINARY)),
    "rows without the fields it needs": Bad(text("fields.jsonl", '{"foo": 1}\n{"foo": 2}\n')),
    "an unsupported file type": Bad(text("rows.csv", "problem,answer\n1+1,2\n")),
}
"""Data files (sources, trajectories, problems) a user gets wrong."""

SOURCE_DIRECTORIES = {
    "a missing directory": Bad(missing("checkpoints")),
    "a file instead of a directory": Bad(text("a-file", "not a directory\n")),
}

SETTINGS = {
    "a negative port": (["--port", "-5"], {}, "--port"),
    "no workers": (["--workers", "0"], {}, "--workers"),
    "a port variable that is not a number": ([], {"RETOOL_SANDBOX_PORT": "eighty"}, "RETOOL_SANDBOX_PORT"),
    "a bad limit variable": ([], {"RETOOL_SANDBOX_MAX_CONNECTIONS": "-1"}, "RETOOL_SANDBOX_MAX_CONNECTIONS"),
}
"""Bad settings of commands that read no file (flags, then their RETOOL_* variables)."""

RUN_REFERENCES = {
    "no MLflow server": (["run-a"], {"MLFLOW_TRACKING_URI": ""}, "--tracking-uri"),
    "an MLflow server nothing listens on": (["run-a", "--tracking-uri", "http://127.0.0.1:9"], {}, "http://127.0.0.1:9"),
    "a run named twice": (["run-a", "run-a", "--tracking-uri", "http://127.0.0.1:9"], {}, "run-a"),
}
"""Bad references of commands that read runs from MLflow, not files (arguments after the command, variables)."""

INPUT_KINDS = {"files": RUN_FILES, "spec": RUN_FILES, "file": RUN_FILES, "source": DATA_FILES, "data": DATA_FILES, "src": SOURCE_DIRECTORIES}
"""The corpus for each argument name that takes the user's input."""
KIND_OF_COMMAND = {("data", "check"): {"file": DATA_FILES}}
"""Where an argument name means another kind of input in one command."""
EXTRA_ARGS = {("render",): ["--manifests"]}
"""Flags that make a command read more of its input (render: the operator's objects too)."""

FILLERS: dict[str, Callable[[Path], str]] = {
    "out": lambda folder: str(folder / "out" / "result.parquet"),
    "dst": lambda folder: str(folder / "destination"),
    "name": lambda folder: "aime_2024",
    "endpoint": lambda folder: "http://127.0.0.1:9",
    "model": lambda folder: "served-model",
}
"""Values of the other required arguments: harmless, so the input is what fails."""


def documented_exit_codes() -> dict[tuple[str, ...], set[int]]:
    """docs/cli.md's exit status table: command words -> the codes it lists (**0**, **10-19**)."""
    table = {}
    for line in (REPO / "docs/cli.md").read_text().splitlines():
        row = re.match(r"\|\s*`retool ([a-z ]+)`\s*\|(.*\*\*\d.*)\|\s*$", line)
        if row:
            codes: set[int] = set()
            for low, high in re.findall(r"\*\*(\d+)(?:-(\d+))?\*\*", row.group(2)):
                codes.update(range(int(low), int(high or low) + 1))
            table[tuple(row.group(1).split())] = codes
    return table


def exit_codes_of(path: tuple[str, ...], table: dict[tuple[str, ...], set[int]]) -> set[int]:
    rows = [words for words in table if path[: len(words)] == words]
    assert rows, f"docs/cli.md documents no exit status for `retool {' '.join(path)}`"
    return table[max(rows, key=len)]


@dataclass
class Case:
    path: tuple[str, ...]
    what: str
    argv: Callable[[Path], tuple[list[str], dict[str, str], str]]
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = f"retool {' '.join(self.path)} on {self.what}"


def _input_action(path: tuple[str, ...], parser: argparse.ArgumentParser) -> tuple[argparse.Action, dict[str, Bad]] | None:
    for action in parser._actions:
        kinds = {**INPUT_KINDS, **KIND_OF_COMMAND.get(path, {})}
        if action.dest in kinds:
            return action, kinds[action.dest]
    return None


def _argv(path: tuple[str, ...], parser: argparse.ArgumentParser, input_action: argparse.Action | None, value: str, folder: Path) -> list[str]:
    argv = [*path, *EXTRA_ARGS.get(path, [])]
    for action in parser._actions:
        if action is input_action:
            argv += [value] if not action.option_strings else [action.option_strings[-1], value]
        elif action.required and action.dest != "help":
            assert action.dest in FILLERS, f"retool {' '.join(path)}: add a harmless value for its required argument {action.dest!r} to FILLERS"
            filler = FILLERS[action.dest](folder)
            argv += [filler] if not action.option_strings else [action.option_strings[-1], filler]
    return argv


def cases() -> list[Case]:
    out = []
    for path, parser in leaf_commands(build_parser()):
        found = _input_action(path, parser)
        if found is None:
            assert path in COMMANDS_WITHOUT_FILES, f"retool {' '.join(path)} reads no file this test knows: add its input argument to INPUT_KINDS or its bad settings"
            for what, (flags, env, names) in COMMANDS_WITHOUT_FILES[path].items():
                out.append(Case(path, what, lambda folder, p=path, f=flags, e=env, n=names: ([*p, *f], e, n)))
            continue
        action, corpus = found
        corpus = {**corpus, **(REFUSED_BY_THE_OPERATOR if any(a.dest == "batch_scheduler" for a in parser._actions) else {})}
        for what, bad in corpus.items():

            def argv(folder: Path, p=path, parser=parser, action=action, bad=bad) -> tuple[list[str], dict[str, str], str]:
                target = bad.make(folder)
                return _argv(p, parser, action, str(target), folder), {}, bad.names(target)

            out.append(Case(path, what, argv))
    return out


COMMANDS_WITHOUT_FILES = {("sandbox", "serve"): SETTINGS, ("compare",): RUN_REFERENCES}
CASES = cases()
EXIT_CODES = documented_exit_codes()


def test_every_command_of_the_cli_is_in_the_corpus() -> None:
    commands = {path for path, _ in leaf_commands(build_parser())}
    assert commands == {case.path for case in CASES}
    assert {("validate",), ("render",), ("preflight",), ("eval",), ("data", "check"), ("data", "prepare", "all"), ("sandbox", "serve")} <= commands


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_input_is_one_line_naming_it_with_a_documented_exit_status(case: Case, tmp_path: Path) -> None:
    argv, env, names = case.argv(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "retool.cli", *argv], cwd=tmp_path, env=repo_env(**env), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode != 0, f"accepted: {output}"
    assert proc.returncode in exit_codes_of(case.path, EXIT_CODES), f"exit {proc.returncode} is not documented for retool {' '.join(case.path)} in docs/cli.md: {output}"
    assert names in output and "<unicode string>" not in output, f"the message does not name {names}: {output}"
    continued = [line for line in output.splitlines() if line[:1].isspace()]
    assert not continued, f"a message spans several lines: {output}"
    assert not list(tmp_path.glob("out/*")) and not (tmp_path / "destination").exists(), "an output was written for a bad input"


def test_a_sandbox_whose_port_is_taken_exits_with_its_documented_status(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = subprocess.run(
            [sys.executable, "-m", "retool.cli", "sandbox", "serve", "--port", port, "--workers", "1"],
            cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert "Traceback" not in proc.stderr and "address already in use" in proc.stderr
    assert proc.returncode in exit_codes_of(("sandbox", "serve"), EXIT_CODES) - {0}, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["compare", "run-a", "--tracking-uri", "http://127.0.0.1:9"], "connection refused"),
        (["compare", "run-a", "--tracking-uri", "http://retool-no-such-host.invalid:5000"], "host not found"),
    ],
    ids=["nothing listens on the port", "the host name does not resolve"],
)
def test_an_unreachable_tracker_is_one_line_saying_why(argv: list[str], reason: str, tmp_path: Path) -> None:
    """No urllib3 retry warnings and no 300-character transport report: one line naming the server and why."""
    proc = subprocess.run([sys.executable, "-m", "retool.cli", *argv], cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("retool compare: MLflow at ") and f"is unreachable ({reason})" in lines[0], lines[0]
    assert len(lines[0]) < 160, lines[0]
    assert proc.returncode == 1
