"""``retool render [--stage STAGE] FILE``: show the exact command each stage of a RetoolRun runs.

The commands come from the same pure renderers the stage pods use (``retool.recipe.render.stages``),
filled with what can be known before the run exists: the sandbox Service URL is derived from the
run's name and namespace; the MLflow server is the spec's, else marked as the operator's default;
the attempt is 1. Values only the cluster knows are listed at the top of each stage.

Output is built from sections (``SECTIONS``), each a function of the parsed run and the
arguments, so further views (e.g. ``--manifests`` with the operator's child objects) are one more
flag and one more section.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from retool.cli.inputs import InputError, add_operator_arguments, operator_settings, read_run
from retool.recipe.render.command import RenderError
from retool.recipe.render.profiles import advice, engine_profile, model_size_billions
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.runtime.claim import claim_name, default_access_modes, default_claim_size
from retool.runtime.context import SPEC_MOUNT_PATH, StageContext
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, STAGES, sandbox_url, stage_child_name
from retool.spec.operator_rules import OperatorSettings

OPERATOR_DEFAULT = "<operator default>"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render",
        help="print the command every stage of a RetoolRun runs",
        description="Print the exact command (environment, files, program and Hydra overrides) that each stage of a RetoolRun runs in its Job or RayJob.",
    )
    parser.add_argument("file", metavar="FILE", help="RetoolRun YAML (one document); '-' reads standard input")
    parser.add_argument("--stage", choices=STAGES, help="only this stage (default: every stage the run executes)")
    parser.add_argument(
        "--manifests",
        action="store_true",
        help="print the Kubernetes objects the operator would create (multi-document YAML, from the operator's builders) instead of the commands",
    )
    add_operator_arguments(parser)
    parser.set_defaults(func=run)


def placeholder_context(run: RetoolRun) -> StageContext:
    """The stage context as the operator will set it, where it can be known ahead of time."""
    namespace = run.metadata.namespace or "default"
    mlflow = run.spec.tracking.mlflow
    return StageContext(
        run_name=run.metadata.name,
        namespace=namespace,
        sandbox_url=sandbox_url(run.metadata.name, namespace),
        attempt=1,
        mlflow_tracking_uri=mlflow.tracking_uri or OPERATOR_DEFAULT,
        mlflow_experiment=mlflow.experiment or f"{namespace}/{run.metadata.name}",
    )


def runtime_values(run: RetoolRun) -> list[str]:
    """What the cluster decides when the stage starts (shown above the commands)."""
    values = ["attempt: 1 here; a retry N renders '-N' in MLflow run names and stage directories"]
    if run.spec.tracking.mlflow.tracking_uri is None:
        values.append(f"MLflow tracking URI: {OPERATOR_DEFAULT} = the chart's tracker or the operator-managed one (MLFLOW_TRACKING_URI)")
    values.append(f"the run's spec is mounted at {SPEC_MOUNT_PATH}; the reward file path is where the trainer image installs retool")
    return values


def _stage_text(run: RetoolRun, stage: str, ctx: StageContext) -> str:
    kind = "RayJob" if stage in RAY_STAGES else "Job"
    header = f"# ===== {stage}: {kind} {stage_child_name(run.metadata.name, stage, ctx.attempt)}"
    try:
        command = render_stage(run, stage, ctx)
    except RenderError as err:
        return f"{header}\n# skipped: {err}"
    return "\n".join([header, *(f"# note: {n}" for n in command.notes), command.script()])


def storage_line(run: RetoolRun) -> str:
    """The run's claim as the operator will use or create it (the storage class of a created claim
    is the spec's, else the operator's default: known only on the cluster)."""
    pvc = run.spec.storage.pvc
    if pvc.claim_name is not None:
        return f"existing claim {pvc.claim_name}, mounted at {pvc.mount_path}"
    size = str(pvc.size) if pvc.size is not None else f"{default_claim_size(run.spec)} (from the model size)"
    kept = "kept when the run is deleted" if run.spec.storage.retain == "keep" else "deleted with the run"
    storage_class = pvc.storage_class_name or "the operator's default class"
    return f"claim {claim_name(run)} created by the operator: {size}, {', '.join(default_access_modes(run.spec))}, {storage_class}, {kept}"


def commands_section(run: RetoolRun, args: argparse.Namespace) -> str:
    ctx = placeholder_context(run)
    stages = [args.stage] if args.stage else list(enabled_stages(run))
    profile = engine_profile(run.spec)
    size = model_size_billions(run.spec)
    lines = [
        f"# RetoolRun {ctx.namespace}/{ctx.run_name}: stages {', '.join(enabled_stages(run))}",
        f"# engine profile: {profile.name} (model {run.spec.model.base}, {size if size is not None else 'unknown'}B, {run.spec.hardware.accelerator})",
        f"# storage: {storage_line(run)}",
        *(f"# set at run time: {v}" for v in runtime_values(run)),
        *(f"# advice: {a}" for a in advice(run.spec)),
    ]
    return "\n".join(lines) + "\n\n" + "\n\n".join(_stage_text(run, stage, ctx) for stage in stages)


SECTIONS: list[tuple[str | None, Callable[[RetoolRun, argparse.Namespace], str]]] = [(None, commands_section)]
"""(flag attribute that enables the section or None for always, section builder)."""


def load(file: str) -> RetoolRun:
    """The RetoolRun in ``file``; InputError (one line per problem, naming the file) when it is not one."""
    return read_run(file)[1]


def manifests(document: dict, stage: str | None, settings: OperatorSettings | None = None) -> str:
    """The operator's child objects (imported here: the operator package, the ``operator`` extra, is only
    needed for this view), built with the operator's configuration from its ``RETOOL_OPERATOR_*``
    variables and the settings given on the command line."""
    from retool_operator.config import OperatorConfig
    from retool_operator.render import render_manifests

    try:
        config = OperatorConfig()
    except ValueError as err:  # pydantic's ValidationError of a bad RETOOL_OPERATOR_* variable
        raise InputError(f"operator settings (RETOOL_OPERATOR_* variables): {' '.join(str(err).split())}") from None
    if settings is not None:
        config = config.model_copy(update={"batch_scheduler": settings.batch_scheduler, "sandbox_max_replicas": settings.sandbox_max_replicas})
    return render_manifests(document, stage=stage, config=config)


def run(args: argparse.Namespace) -> int:
    # Exit 1 for a file that is not a run this operator accepts (docs/cli.md), as `retool validate`.
    settings = operator_settings(args.batch_scheduler, args.sandbox_max_replicas, os.environ) if args.manifests else None
    document, retool_run = read_run(args.file, settings=settings, exit_code=1)
    if args.stage and args.stage not in enabled_stages(retool_run):
        raise InputError(f"{args.file}: stage {args.stage} is disabled in this run (enabled: {', '.join(enabled_stages(retool_run))})", exit_code=1)
    if args.manifests:
        sys.stdout.write(manifests(document, args.stage, settings))
        return 0
    parts = [build(retool_run, args) for flag, build in SECTIONS if flag is None or getattr(args, flag, False)]
    print("\n\n".join(parts))
    return 0
