"""``retool sandbox serve``: run a code sandbox replica (what the sandbox Deployment's pods run)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from retool.cli.inputs import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sandbox", help="the code sandbox service: sandbox serve", description="SandboxFusion-compatible code sandbox.")
    commands = parser.add_subparsers(dest="sandbox_command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve POST /run_code, /v1/ping, /healthz, /readyz and /metrics",
        description="Serve the sandbox. Other settings come from RETOOL_SANDBOX_* environment variables (see the README).",
    )
    from retool.sandbox.serve import add_arguments

    add_arguments(serve)
    serve.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from retool.sandbox.serve import serve, settings_from

    try:
        settings = settings_from(args)
    except ValidationError as err:
        raise InputError([settings_problem(error) for error in err.errors()]) from None
    serve(settings, args.log_level)
    return 0


FLAGS = ("host", "port", "workers")
"""Settings that have a flag besides their variable (``retool.sandbox.serve.add_arguments``)."""


def settings_problem(error: Mapping[str, Any]) -> str:
    """One invalid setting as ``--flag / RETOOL_SANDBOX_NAME: what``, whichever of the two the user set."""
    from retool.sandbox.settings import SandboxSettings

    name = str(error["loc"][0]) if error["loc"] else "settings"
    variable = f"{SandboxSettings.model_config.get('env_prefix', '')}{name.upper()}"
    where = f"--{name} / {variable}" if name in FLAGS else variable
    return f"{where}: {error['msg']}, got {error.get('input')!r}"
