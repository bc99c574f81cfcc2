"""``retool data check FILE``: re-execute the code of SFT trajectories and score their answers.

Registered under ``retool data`` by ``register_check(data_subparsers)`` (the ``data`` command
owns its sub-commands). Exit 0 when the figures reach the thresholds, 1 when they do not,
2 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from retool.cli.sandboxed import add_sandbox_arguments, run_reading_file, sandbox_config


def register_check(data_subparsers: argparse._SubParsersAction) -> None:
    parser = data_subparsers.add_parser(
        "check",
        help="re-run every code block of SFT trajectories in the sandbox and score the final answers",
        description=(
            "Check SFT trajectories (ReTool-SFT layout or multi-turn tool_calls): re-execute every code block in the sandbox, "
            "compare with the recorded interpreter output, score the final answers with the training reward, write report.json and report.md."
        ),
    )
    add_check_arguments(parser)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE", help="parquet, jsonl or json file of trajectories")
    parser.add_argument("--out", type=Path, default=Path("data-check"), help="report directory (report.json, report.md); default ./data-check")
    parser.add_argument("--concurrency", type=int, default=8, help="code blocks in flight; default 8")
    parser.add_argument("--data-source", default="retool_sft", help="data source passed to the reward; default retool_sft")
    parser.add_argument("--limit", type=int, default=None, help="check only the first N rows")
    parser.add_argument("--min-agreement", type=float, default=1.0, help="fail below this share of recorded outputs reproduced; default 1.0")
    parser.add_argument("--min-accuracy", type=float, default=1.0, help="fail below this share of correct final answers (rows with a ground truth); default 1.0")
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"), help="log the figures and the report to MLflow (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--experiment", default="retool-data-check", help="MLflow experiment; default retool-data-check")
    add_sandbox_arguments(parser, per="code block", log_dir=Path("build/data-check"))
    parser.set_defaults(func=run_check_command)


def run_check_command(args: argparse.Namespace) -> int:
    from retool.data_check.app import CheckConfig, run_check

    if args.concurrency < 1:
        print("retool data check: --concurrency must be at least 1", file=sys.stderr)
        return 2
    config = CheckConfig(
        file=args.file,
        out_dir=args.out,
        concurrency=args.concurrency,
        data_source=args.data_source,
        limit=args.limit,
        mlflow_uri=args.mlflow_uri,
        experiment=args.experiment,
        **sandbox_config(args),
    )
    outcome = run_reading_file("retool data check", run_check(config, progress=sys.stderr.isatty()))
    if outcome is None:
        return 2
    metrics = outcome.report.metrics()
    for line in outcome.report.problems()[:20]:
        print(line)
    agreement, accuracy = metrics.get("data_check/output_agreement"), metrics.get("data_check/answer_accuracy")
    reproduced = f"outputs reproduced {agreement:.1%}" if agreement is not None else "no recorded outputs to compare"
    correct = f"answers correct {accuracy:.1%} of {int(metrics['data_check/answers_scored'])} scored" if accuracy is not None else "no ground truth to score answers against"
    print(f"{int(metrics['data_check/trajectories'])} trajectories, {int(metrics['data_check/blocks'])} code blocks: {reproduced}, {correct}")
    print(f"report: {outcome.markdown_path} and {outcome.json_path}")
    if outcome.mlflow:
        print(f"mlflow: {outcome.mlflow.url}")
    failed = metrics["data_check/unreadable_rows"] > 0 or (agreement is not None and agreement < args.min_agreement)
    failed = failed or (accuracy is not None and accuracy < args.min_accuracy)
    return 1 if failed else 0
