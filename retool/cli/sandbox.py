"""``retool sandbox serve``: run a code sandbox replica (what the sandbox Deployment's pods run)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sandbox", help="the code sandbox service", description="SandboxFusion-compatible code sandbox.")
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
    from retool.sandbox.serve import serve, settings_from

    serve(settings_from(args), args.log_level)
    return 0
