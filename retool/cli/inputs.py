"""Reading what a user hands a ``retool`` command, so a mistake is one line and never a traceback.

Every command reads its RetoolRun through ``read_run`` (and its other files through
``read_text``); what is wrong comes back as an ``InputError`` whose lines each name the file (and,
for a spec, the field), which ``retool.cli.main`` prints and turns into the command's documented
exit status (docs/cli.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from retool.spec.model import RetoolRun
from retool.spec.operator_rules import OperatorSettings, operator_refusals
from retool.spec.validate import SpecError, describe_yaml_error, load_documents, parse_run

STDIN = "-"


class InputError(Exception):
    """Input a command cannot use: ``lines`` (each naming the file) go to stderr, then exit ``exit_code``."""

    def __init__(self, lines: list[str] | str, exit_code: int = 2):
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        self.exit_code = exit_code
        super().__init__("; ".join(self.lines))


def read_text(file: str | Path, *, what: str = "file") -> str:
    """The UTF-8 text of ``file`` ('-' reads standard input); InputError for a missing, unreadable or binary file."""
    if str(file) == STDIN:
        return sys.stdin.read()
    path = Path(file)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{file}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{file}: is a directory, expected a {what}") from None
    except OSError as err:
        raise InputError(f"{file}: cannot read it: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InputError(f"{file}: not UTF-8 text, expected a {what}") from None


def read_documents(file: str | Path) -> list[Any]:
    """The non-empty YAML documents of ``file`` (numbers read as kubectl reads them)."""
    text = read_text(file, what="YAML file")
    try:
        return load_documents(text)
    except yaml.YAMLError as err:
        raise InputError(f"{file}: {describe_yaml_error(err)}") from None


def read_run_document(file: str | Path) -> dict[str, Any]:
    """The one RetoolRun document of ``file``, still unvalidated (a mapping)."""
    documents = read_documents(file)
    if len(documents) != 1:
        raise InputError(f"{file}: expected one RetoolRun document, found {len(documents)}")
    document = documents[0]
    if not isinstance(document, dict):
        raise InputError(f"{file}: (document): expected a RetoolRun mapping, got {type(document).__name__}")
    return document


def run_problems_error(file: str | Path, err: SpecError, exit_code: int) -> InputError:
    return InputError([f"{file}: {problem}" for problem in err.problems], exit_code)


def read_run(
    file: str | Path,
    adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    *,
    settings: OperatorSettings | None = None,
    exit_code: int = 2,
) -> tuple[dict[str, Any], RetoolRun]:
    """The document in ``file`` (passed through ``adjust``) and the run it parses to.

    With ``settings``, what an operator with those settings would refuse is a problem too. Raises
    InputError (exit ``exit_code``) with one line per problem, each naming ``file`` (and the field),
    whether the file cannot be read, is not YAML, or is not a run.
    """
    try:
        document = read_run_document(file)
    except InputError as err:
        raise InputError(err.lines, exit_code) from None
    if adjust is not None:
        document = adjust(document)
    try:
        run = parse_run(document)
    except SpecError as err:
        raise run_problems_error(file, err, exit_code) from None
    refusals = operator_refusals(run, settings) if settings is not None else []
    if refusals:
        raise run_problems_error(file, SpecError(refusals), exit_code)
    return document, run


def operator_settings(batch_scheduler: str | None, sandbox_max_replicas: int | None, environ: Mapping[str, str]) -> OperatorSettings:
    """The operator settings from the flags, else the operator's ``RETOOL_OPERATOR_*`` variables, else the chart's defaults."""
    try:
        base = OperatorSettings.from_env(environ)
        return OperatorSettings(
            batch_scheduler=base.batch_scheduler if batch_scheduler is None else ("" if batch_scheduler == "none" else batch_scheduler),
            sandbox_max_replicas=base.sandbox_max_replicas if sandbox_max_replicas is None else sandbox_max_replicas,
        )
    except ValueError as err:
        raise InputError(f"operator settings: {err}") from None


def add_operator_arguments(parser: Any) -> None:
    """``--batch-scheduler`` and ``--sandbox-max-replicas``: the settings of the operator the run is for."""
    parser.add_argument(
        "--batch-scheduler",
        choices=("none", "volcano", "yunikorn"),
        default=None,
        help="KubeRay's batch scheduler on the target cluster (the chart's defaults.batchScheduler); default: $RETOOL_OPERATOR_BATCH_SCHEDULER, else none",
    )
    parser.add_argument(
        "--sandbox-max-replicas",
        type=int,
        default=None,
        help="sandbox replicas the target operator allows one run (the chart's limits.sandboxReplicas); default: $RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS, else 256",
    )
