"""``retool validate FILE...``: check RetoolRun YAML before it reaches a cluster.

Meant for GitOps pull-request checks: one line per problem naming the field, exit code 1 on
any problem, 0 when every document is a RetoolRun the target operator accepts. The operator's
settings that decide acceptance beyond the spec (its batch scheduler, its sandbox replica limit)
come from ``--batch-scheduler`` / ``--sandbox-max-replicas``, else the operator's own
``RETOOL_OPERATOR_*`` variables, else the chart's defaults: the same as ``retool render --manifests``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from retool.cli.inputs import add_operator_arguments, operator_settings
from retool.spec.validate import FileProblem, validate_file, validate_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="validate RetoolRun YAML files (multi-document too)",
        description="Validate RetoolRun YAML files. Prints 'FILE#DOC: path.to.field: message' per problem; exit 1 on any.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files; '-' reads standard input")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    add_operator_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = operator_settings(args.batch_scheduler, args.sandbox_max_replicas, os.environ)
    documents = 0
    problems: list[FileProblem] = []
    for name in args.files:
        count, found = validate_text(sys.stdin.read(), "<stdin>", settings) if name == "-" else validate_file(name, settings)
        documents += count
        problems.extend(found)
    if args.format == "json":
        payload = [{"file": p.file, "document": p.document, "path": p.problem.path, "message": p.problem.message} for p in problems]
        print(json.dumps({"documents": documents, "problems": payload}, indent=2))
    else:
        for p in problems:
            print(f"{p.file}#{p.document}: {p.problem.path}: {p.problem.message}")
        summary = f"{documents} document(s), {len(problems)} problem(s)"
        print(summary if problems else f"{summary}: all valid", file=sys.stderr)
    return 1 if problems else 0
