"""``python -m retool.staging --spec RUN.yaml``: the prepare stage's model staging step."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from retool.runtime.context import ENV_HF_TOKEN, SPEC_MOUNT_PATH
from retool.spec.validate import parse_run
from retool.staging.plan import StagingError, staging_plan
from retool.staging.run import stage_model

log = logging.getLogger("retool.staging")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.staging", description="Stage the run's base model onto its PVC (verified, resumable).")
    parser.add_argument("--spec", default=SPEC_MOUNT_PATH, help=f"the RetoolRun YAML (default {SPEC_MOUNT_PATH})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        run = parse_run(yaml.safe_load(Path(args.spec).read_text(encoding="utf-8")))
        plan = staging_plan(run)
        stage_model(plan, token=os.environ.get(ENV_HF_TOKEN) or None)
    except (OSError, ValueError, StagingError, yaml.YAMLError) as err:
        log.error("cannot stage the model: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
