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
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from retool.recipe.render.command import RenderError
from retool.recipe.render.profiles import advice, engine_profile, model_size_billions
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.runtime.claim import claim_name, default_access_modes, default_claim_size
from retool.runtime.context import SPEC_MOUNT_PATH, StageContext
from retool.spec.model import RetoolRun
from retool.spec.names import RAY_STAGES, STAGES, sandbox_url, stage_child_name
from retool.spec.validate import SpecError, load_documents, parse_run

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


def load_document(file: str) -> dict:
    text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    documents = load_documents(text)  # numbers as kubectl reads them (1e-5), as `retool validate` does
    if len(documents) != 1:
        raise ValueError(f"{file}: expected one RetoolRun document, found {len(documents)}")
    return documents[0]


def load(file: str) -> RetoolRun:
    return parse_run(load_document(file))


def read_run(file: str, adjust: Callable[[dict], dict] | None = None) -> tuple[dict, RetoolRun] | None:
    """The document in ``file`` (passed through ``adjust``) and the run it parses to; None once what is
    wrong (unreadable, not one document, invalid spec) is printed to stderr, each line naming ``file``."""
    try:
        document = load_document(file)
        if adjust is not None:
            document = adjust(document)
        return document, parse_run(document)
    except SpecError as err:
        for problem in err.problems:
            print(f"{file}: {problem}", file=sys.stderr)
    except (OSError, ValueError, yaml.YAMLError) as err:
        print(f"{file}: {err}", file=sys.stderr)
    return None


def manifests(document: dict, stage: str | None) -> str:
    """The operator's child objects (imported here: the operator package is only needed for this view)."""
    from retool_operator.render import render_manifests

    return render_manifests(document, stage=stage)


def run(args: argparse.Namespace) -> int:
    loaded = read_run(args.file)
    if loaded is None:
        return 1
    document, retool_run = loaded
    if args.stage and args.stage not in enabled_stages(retool_run):
        print(f"{args.file}: stage {args.stage} is disabled in this run (enabled: {', '.join(enabled_stages(retool_run))})", file=sys.stderr)
        return 1
    if args.manifests:
        sys.stdout.write(manifests(document, args.stage))
        return 0
    parts = [build(retool_run, args) for flag, build in SECTIONS if flag is None or getattr(args, flag, False)]
    print("\n\n".join(parts))
    return 0
