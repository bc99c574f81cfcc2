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
from dataclasses import replace
from pathlib import Path

from retool.cli.inputs import add_operator_arguments, operator_settings
from retool.spec.model_fit import read_model_config
from retool.spec.problem import Problem
from retool.spec.validate import FileProblem, model_fit_problems, validate_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="validate RetoolRun YAML files (multi-document too)",
        description="Validate RetoolRun YAML files. Prints 'FILE#DOC: path.to.field: message' per problem; exit 1 on any.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files; '-' reads standard input")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    add_operator_arguments(parser)
    parser.add_argument(
        "--model-config",
        metavar="PATH",
        help="the model's config.json (or its directory): also check context window, heads vs parallelism and memory per device "
        "(default: spec.model.base when it is a local directory holding config.json)",
    )
    parser.set_defaults(func=run)


def with_flag_advice(found: FileProblem, batch_scheduler: str) -> FileProblem:
    """A refusal that depends on the operator's batch scheduler also names the flag that sets the one checked
    against: the operator's own message names its chart value, which means nothing to a pull-request check."""
    if found.problem.path == "spec.scheduling.gang.enabled" and not batch_scheduler:
        advice = "retool validate assumed an operator without one: --batch-scheduler volcano (or yunikorn) checks against one whose KubeRay has it"
    elif found.problem.path == "spec.scheduling.queueName" and batch_scheduler:
        advice = f"retool validate assumed --batch-scheduler {batch_scheduler}: --batch-scheduler none checks against an operator without one"
    else:
        return found
    return replace(found, problem=Problem(found.problem.path, f"{found.problem.message}. {advice}"))


def run(args: argparse.Namespace) -> int:
    settings = operator_settings(args.batch_scheduler, args.sandbox_max_replicas, os.environ)
    try:
        model_config = read_model_config(args.model_config) if args.model_config else None
    except ValueError as err:
        print(f"retool validate: --model-config: {err}", file=sys.stderr)
        return 2
    documents = 0
    problems: list[FileProblem] = []
    warnings: list[FileProblem] = []
    for name in args.files:
        if name == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            try:
                text, source = Path(name).read_text(encoding="utf-8"), name
            except OSError as err:
                problems.append(FileProblem(name, 0, Problem("(file)", err.strerror or str(err))))
                continue
            except UnicodeDecodeError:
                problems.append(FileProblem(name, 0, Problem("(file)", "not UTF-8 text (is it a YAML file?)")))
                continue
        count, found = validate_text(text, source, settings)
        documents += count
        problems.extend(with_flag_advice(p, settings.batch_scheduler) for p in found)
        model_errors, model_warnings = model_fit_problems(text, source, model_config)
        problems.extend(model_errors)
        warnings.extend(model_warnings)
    if args.format == "json":
        payload = [{"file": p.file, "document": p.document, "path": p.problem.path, "message": p.problem.message} for p in problems]
        warned = [{"file": p.file, "document": p.document, "path": p.problem.path, "message": p.problem.message} for p in warnings]
        print(json.dumps({"documents": documents, "problems": payload, **({"warnings": warned} if warned else {})}, indent=2))
    else:
        for p in problems:
            print(f"{p.file}#{p.document}: {p.problem.path}: {p.problem.message}")
        for p in warnings:
            print(f"{p.file}#{p.document}: {p.problem.path}: warning: {p.problem.message}", file=sys.stderr)
        summary = f"{documents} document(s), {len(problems)} problem(s)"
        print(summary if problems else f"{summary}: all valid", file=sys.stderr)
    return 1 if problems else 0
