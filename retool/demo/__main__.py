"""``python -m retool.demo [--keep] [--out DIR]``: run the local demo and say where to look."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from retool.demo.pipeline import DEMO_MLFLOW_PORT, REPO_EXAMPLE, DemoConfig, DemoSetupError, demo_ok, run_demo, stop_previous_mlflow, summary_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.demo", description="Run the ReTool platform demo on an embedded stack (no cluster, no GPU).")
    parser.add_argument("--out", type=Path, default=Path("build/demo"), help="output directory; default build/demo")
    parser.add_argument("--example", type=Path, default=REPO_EXAMPLE, help=f"RetoolRun to render; default {REPO_EXAMPLE}")
    parser.add_argument(
        "--keep", action="store_true", default=os.environ.get("KEEP", "") not in ("", "0"), help="leave MLflow running afterwards (also KEEP=1 in the environment)"
    )
    parser.add_argument(
        "--mlflow-port",
        type=int,
        default=int(os.environ.get("MLFLOW_PORT") or DEMO_MLFLOW_PORT),
        help=f"port of the MLflow server --keep leaves running (or MLFLOW_PORT); default {DEMO_MLFLOW_PORT}",
    )
    parser.add_argument(
        "--eval-endpoint",
        default=os.environ.get("EVAL_ENDPOINT") or None,
        help="also run retool eval on the demo's eval set against this OpenAI-compatible server (or EVAL_ENDPOINT)",
    )
    parser.add_argument("--eval-model", default=os.environ.get("EVAL_MODEL") or None, help="the model name that server serves (or EVAL_MODEL)")
    parser.add_argument("--eval-n", type=int, default=4, help="samples per problem for that evaluation; default 4")
    parser.add_argument(
        "--no-train", action="store_true", default=os.environ.get("TRAIN", "1") == "0", help="skip the training rehearsal (also TRAIN=0 in the environment)"
    )
    parser.add_argument(
        "--trainer-python", type=Path, default=Path(".venv-verl09/bin/python"), help="the trainer environment of the rehearsal (verl 0.9.1); default .venv-verl09/bin/python"
    )
    parser.add_argument("--stop", action="store_true", help="only stop the MLflow server a previous --keep demo left running, then exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what every step does")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.stop:
        stopped = stop_previous_mlflow(args.out.resolve() / "mlflow.pid")
        sys.stdout.write("stopped the demo's MLflow server\n" if stopped else "no demo MLflow server was running\n")
        return 0
    if not args.example.is_file():
        parser.error(f"{args.example}: no such file (run from the repository root, or pass --example)")
    if args.eval_endpoint and not args.eval_model:
        parser.error("--eval-endpoint needs --eval-model (EVAL_MODEL=...)")
    if not args.no_train and not args.trainer_python.exists():
        parser.error(f"{args.trainer_python}: no such interpreter; the training rehearsal runs in verl 0.9.1's environment (make install-verl09), or TRAIN=0 skips it")
    config = DemoConfig(
        out=args.out,
        example=args.example,
        keep=args.keep,
        mlflow_port=args.mlflow_port,
        progress=not args.no_progress,
        eval_endpoint=args.eval_endpoint,
        eval_model=args.eval_model,
        eval_n=args.eval_n,
        train=not args.no_train,
        trainer_python=args.trainer_python,
    )
    try:
        summary = run_demo(config)
    except DemoSetupError as err:
        sys.stderr.write(f"retool demo: {err}\n")
        return 2
    sys.stdout.write(summary_text(summary))
    return 0 if demo_ok(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
