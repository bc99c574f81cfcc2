"""``python3 -m retool.preflight``: the preflight stage's program in its pod (see ``command.py``).

It reads the stage context the operator put in the environment (``retool.runtime.context``: run
name, namespace, sandbox URL, attempt), the spec mounted at ``--spec``, and ``MLFLOW_TRACKING_URI``
/ ``MLFLOW_RUN_ID`` from the stage entry. Exit status: 0 passed, 2 could not start, 10-22 the first
failed check (``retool.preflight.checks.CHECKS``); 1 is a crash of the preflight itself (a bug:
the traceback is in the log), never a verdict on the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from retool.preflight.checks import EXIT_SETUP
from retool.runtime.context import SPEC_MOUNT_PATH, StageContext

logger = logging.getLogger("retool.preflight")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m retool.preflight", description="Check a RetoolRun through verl's runtime code before any accelerator is requested.")
    parser.add_argument("--spec", default=SPEC_MOUNT_PATH, help=f"the RetoolRun YAML (default {SPEC_MOUNT_PATH})")
    parser.add_argument("--tokenizer", required=True, help="directory with the model's tokenizer files (or a hub id)")
    parser.add_argument("--report-dir", required=True, type=Path, help="where the report and scratch files go")
    parser.add_argument("--sandbox-wait", type=float, default=90.0, help="seconds the sandbox may take to answer its first ping")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    environ = os.environ if environ is None else environ
    try:
        from retool.preflight.plan import PreflightOptions, plan
        from retool.spec.validate import parse_run

        ctx = StageContext.from_env(environ)
        run = parse_run(yaml.safe_load(Path(args.spec).read_text(encoding="utf-8")))
        target = plan(run, ctx)
    except (OSError, ValueError, yaml.YAMLError) as err:
        logger.error("cannot start the preflight: %s", err)
        return EXIT_SETUP
    from retool.preflight.entry import execute

    options = PreflightOptions(tokenizer=args.tokenizer, work_dir=args.report_dir, sandbox_wait_s=args.sandbox_wait)
    report = execute(target, options, tracking_uri=environ.get("MLFLOW_TRACKING_URI"), run_id=environ.get("MLFLOW_RUN_ID"))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
