"""``retool compare``: RetoolRuns side by side (final eval scores, RL validation and tool-use dynamics vs step).

    retool compare qwen32b-h200 qwen32b-h200-text-only --tracking-uri http://mlflow:5000

Each RUN is a RetoolRun name (``name`` or ``namespace/name``) or an MLflow run id (a parent run or
one of its stage runs). Writes ``report.png``, ``report.html`` (self-contained) and ``table.json``
to ``--out``, logs them under ``compare/<run>-vs-<run>/`` of every compared parent run (unless
``--no-log``) and prints the table. Exit 2 on bad input, 1 when MLflow cannot be read or written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare RetoolRuns: final eval scores, RL validation and tool-use dynamics vs step",
        description="Tabulate RetoolRuns' final eval scores beside their RL validation curves (verl's mean@k, maj@k, best@k) and plot those "
        "and the tool-use dynamics on shared axes, one colour per run (report.html: interactive, self-contained).",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="RetoolRun name (name or namespace/name) or MLflow run id")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"), help="MLflow server (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--out", type=Path, default=Path("retool-compare"), help="directory for report.png, report.html, table.json; default retool-compare")
    parser.add_argument(
        "--smooth", type=float, default=0.0, metavar="W", help="exponential moving average of the curves (TensorBoard's weight, 0 <= W < 1; raw points stay faint); default 0"
    )
    parser.add_argument("--no-log", action="store_true", help="do not log the report to the parent runs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.tracking_uri:
        print("retool compare: no MLflow server: give --tracking-uri or set MLFLOW_TRACKING_URI", file=sys.stderr)
        return 2
    twice = sorted({ref for ref in args.runs if args.runs.count(ref) > 1})
    if twice:
        print(f"retool compare: {', '.join(twice)}: named twice", file=sys.stderr)
        return 2
    from retool.tracking import TrackingError
    from retool.tracking._client import fail_fast
    from retool.tracking.compare import build_report, load_run_series, log_report, resolve_parent, write_report

    fail_fast(os.environ)
    try:
        runs = [load_run_series(args.tracking_uri, resolve_parent(args.tracking_uri, ref)) for ref in args.runs]
        if len({r.parent_run_id for r in runs}) != len(runs):
            print("retool compare: two of the names given are the same RetoolRun", file=sys.stderr)
            return 2
        report = build_report(runs, smoothing=args.smooth)
        files = write_report(report, args.out)
        logged = None if args.no_log else log_report(args.tracking_uri, runs, report)
    except TrackingError as err:
        print(f"retool compare: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"retool compare: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"retool compare: {err.name or err} is missing: install the train extra (plotly, matplotlib)", file=sys.stderr)
        return 2
    print(report.text)
    print(f"\nwrote {', '.join(str(f) for f in files)}")
    if logged:
        print(f"logged under {logged}/ of each parent run")
    return 0
