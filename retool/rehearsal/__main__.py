"""``python -m retool.rehearsal [--out DIR] [--python PY]``: train a tiny model through every stage, on this CPU.

Starts our sandbox and an MLflow server (sqlite) on 127.0.0.1, runs prepare -> preflight -> sft ->
merge -> rl -> eval of the rehearsal RetoolRun (``retool.rehearsal.spec``) with each stage's own
command in the trainer environment ``--python`` (the 0.9 line's, ``.venv-verl09``), says what it
measured, and stops what it started (``--keep`` leaves MLflow up to browse). ``make demo`` runs the
same after the demo's other steps.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from retool.embedded.servers import mlflow_server, sandbox_server
from retool.rehearsal.pipeline import RehearsalConfig, StageFailedError, set_up
from retool.rehearsal.summary import summarize, summary_lines

DEFAULT_PYTHON = Path(".venv-verl09/bin/python")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.rehearsal", description="Train a tiny model through every stage's own command on this CPU (no cluster, no GPU).")
    parser.add_argument("--out", type=Path, default=Path("build/rehearsal"), help="output directory; default build/rehearsal")
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help=f"the trainer environment's interpreter (verl 0.9.1); default {DEFAULT_PYTHON}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per training process (default: one per core; 1 where other work shares the machine)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.python.exists():
        parser.error(f"{args.python}: no such interpreter; the rehearsal trains in verl 0.9.1's environment (make install-verl09), or pass --python")
    out = args.out.resolve()
    with sandbox_server(out / "logs", workers=2) as sandbox, mlflow_server(out / "mlflow") as mlflow:
        config = RehearsalConfig(
            out=out, python=args.python.absolute(), sandbox_url=sandbox.base_url, mlflow_uri=mlflow.base_url, progress=not args.no_progress, threads=args.threads
        )
        rehearsal = set_up(config)
        try:
            rehearsal.run_all()
        except StageFailedError as err:
            sys.stderr.write(f"retool rehearsal: {err}\n")
            return 1
        sys.stdout.write("\n".join(["", "ReTool training rehearsal: done", "", *summary_lines(summarize(rehearsal)), ""]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
