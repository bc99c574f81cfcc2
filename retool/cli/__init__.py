"""The ``retool`` command line. Each sub-command lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Modules under retool.cli, each defining register(subparsers) that adds one sub-command.
COMMANDS: tuple[str, ...] = (
    "validate",
    "data",
    "render",
    "storage",
    "sandbox",
    "eval",
    "preflight",
    "compare",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retool",
        description="ReTool platform: validate and render RetoolRuns, run the sandbox, prepare data, preflight a run.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            importlib.import_module(f"retool.cli.{name}").register(subparsers)
        except ModuleNotFoundError as err:
            _register_unavailable(subparsers, name, err)
    return parser


EXTRA_OF_COMMAND = {"sandbox": "sandbox", "data": "train", "storage": "train", "eval": "train", "preflight": "train"}
"""The pyproject extra each command needs beyond the base package (validate and render need none)."""


def _needs_extra(name: str, err: ModuleNotFoundError) -> str:
    extra = EXTRA_OF_COMMAND.get(name, "dev")
    return f"retool {name} needs the '{extra}' extra (missing module {err.name!r}): pip install 'retool[{extra}]'"


def _register_unavailable(subparsers: argparse._SubParsersAction, name: str, err: ModuleNotFoundError) -> None:
    """Each image installs only its extra: a command whose dependencies are absent says which to add
    instead of breaking every other command of the CLI."""
    extra = EXTRA_OF_COMMAND.get(name, "dev")
    reason = _needs_extra(name, err)
    parser = subparsers.choices.get(name)  # register() may have failed after adding its parser
    if parser is None:
        parser = subparsers.add_parser(name, help=f"(unavailable here: needs the '{extra}' extra)", add_help=False)
        parser.add_argument("rest", nargs=argparse.REMAINDER)

    def unavailable(_args: argparse.Namespace) -> int:
        print(reason, file=sys.stderr)
        return 2

    parser.set_defaults(func=unavailable)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as err:  # a command whose extra is not installed in this image
        print(_needs_extra(args.command, err), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
