"""The ``retool`` command line. Each sub-command lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Sequence

from retool.cli.inputs import InputError
from retool.version import version_line

BUG_EXIT_CODE = 70
"""sysexits' EX_SOFTWARE: an exception no command expected, i.e. a bug in retool (docs/cli.md)."""

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
    parser.add_argument("--version", action="version", version=version_line(), help="print the version (quote it when you report a bug) and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            importlib.import_module(f"retool.cli.{name}").register(subparsers)
        except ModuleNotFoundError as err:
            _register_unavailable(subparsers, name, err)
    for path, leaf in leaf_commands(parser):
        leaf.set_defaults(command_path=" ".join(("retool", *path)))
    return parser


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command under ``parser`` as (words after ``retool``, its parser), e.g. (("data", "prepare", "rl"), ...)."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return [(path, parser)]
    return [leaf for group in groups for name, child in group.choices.items() for leaf in leaf_commands(child, (*path, name))]


EXTRA_OF_COMMAND = {"sandbox": "sandbox", "data": "train", "storage": "train", "eval": "train", "preflight": "train", "render": "operator"}
"""The pyproject extra each command needs beyond the base package (validate needs none; render only
for --manifests, which builds the operator's objects)."""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_providing(module: str, requirements: Sequence[str]) -> list[str]:
    """The extras (fewest requirements first, ``dev`` last) whose requirements install ``module``'s
    distribution, read from ``Requires-Dist`` lines (``kopf==1.45.2; extra == "operator"``); matched
    by name, so a module named unlike its distribution (``yaml``/PyYAML) finds none."""
    members: dict[str, set[str]] = {}
    for line in requirements:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", line)
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if extra and name:
            members.setdefault(extra.group(1), set()).add(_normalized(name.group(0)))
    wanted = _normalized(module.split(".")[0])
    found = [extra for extra, names in members.items() if wanted in names]
    return sorted(found, key=lambda extra: (extra == "dev", len(members[extra]), extra))


def extra_for(name: str, err: ModuleNotFoundError) -> str:
    """The extra to install for command ``name``: its own (``EXTRA_OF_COMMAND``), else the smallest
    extra whose requirements name the missing module (the package's metadata), else ``dev``."""
    if name in EXTRA_OF_COMMAND:
        return EXTRA_OF_COMMAND[name]
    import importlib.metadata  # only on this path: it costs a tenth of a second at every start

    try:
        requirements = importlib.metadata.metadata("retool").get_all("Requires-Dist") or []
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        requirements = []
    found = extras_providing(err.name or "", requirements) if err.name else []
    return found[0] if found else "dev"


def _needs_extra(name: str, err: ModuleNotFoundError) -> str:
    extra = extra_for(name, err)
    return f"retool {name} needs the '{extra}' extra (missing module {err.name!r}): pip install 'retool[{extra}]'"


def _register_unavailable(subparsers: argparse._SubParsersAction, name: str, err: ModuleNotFoundError) -> None:
    """Each image installs only its extra: a command whose dependencies are absent says which to add
    instead of breaking every other command of the CLI."""
    extra = extra_for(name, err)
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
    except InputError as err:  # a user's mistake: one line per problem, each naming the file and field
        for line in err.lines:
            print(f"{getattr(args, 'command_path', 'retool')}: {line}", file=sys.stderr)
        return err.exit_code
    except ModuleNotFoundError as err:  # a command whose extra is not installed in this image
        print(_needs_extra(args.command, err), file=sys.stderr)
        return 2
    except Exception:  # a bug: the traceback, then what a report needs
        import traceback

        traceback.print_exc()
        print(f"{getattr(args, 'command_path', 'retool')}: unexpected error: this is a bug in {version_line()}; please report it with the lines above", file=sys.stderr)
        return BUG_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
