"""``retool data prepare sft|rl|eval|all``: turn raw data sets into the parquet files verl trains on.

``all`` reads a RetoolRun and writes every output where the later stages look for it: this is the
command the operator's prepare stage runs (the spec is mounted at /etc/retool/run.yaml).
Exit 0 when the outputs were written (malformed rows are reported), 1 on an unreadable spec or
source, a source without a single valid row, or one whose malformed rows exceed the limit
(``--max-malformed-fraction``, else the run's ``spec.data.maxMalformedFraction``, default 5%); on
exit 1 no output is published.
"""

from __future__ import annotations

import argparse
import json

from retool.cli.inputs import InputError, read_run
from retool.runtime.context import SPEC_MOUNT_PATH


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser(
        "data", help="data prepare: SFT, RL and evaluation data to parquet; data check: re-run and score SFT trajectories in the sandbox", description="Data set preparation."
    )
    actions = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prepare = actions.add_parser("prepare", help="convert a data source into verl parquet", description="Convert data sources into verl parquet.")
    kinds = prepare.add_subparsers(dest="kind", metavar="KIND", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--split", default="train", help="split of a hub dataset (default: train)")
        parser.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint for s3:// sources (default: boto3's, e.g. AWS_ENDPOINT_URL)")
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")
        parser.add_argument(
            "--max-malformed-fraction",
            type=fraction,
            default=None,
            help="fail, publishing nothing, when more than this share of a source's rows is malformed (default: the spec's data.maxMalformedFraction, 0.05)",
        )
        parser.set_defaults(func=run)

    def single(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = kinds.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--source", required=True, help="hub id (org/name), local parquet/jsonl file or directory, or s3://bucket/key")
        parser.add_argument("--out", required=True, help="output parquet file")
        common(parser)
        return parser

    sft = single("sft", "ReTool-SFT (or multi-turn) trajectories -> multi-turn messages + tools")
    sft.add_argument("--data-source", default="retool_sft", help="data_source of rows that have none")
    sft.add_argument("--keep-prompts", action="store_true", help="keep ReTool's original user prompts (default: question + the single answer instruction)")
    rl = single("rl", "DAPO-Math-17k -> deduplicated RL prompts with one answer instruction")
    rl.add_argument("--data-source", default=None, help="override every row's data_source")
    ev = single("eval", "AIME-style problems (Problem/Answer or problem/answer) -> eval parquet")
    ev.add_argument("--name", required=True, help="eval set name, used as data_source (e.g. aime_2024)")
    everything = kinds.add_parser("all", help="every output of a RetoolRun, at its run paths", description="Prepare every data set of a RetoolRun.")
    everything.add_argument("--spec", default=SPEC_MOUNT_PATH, help=f"RetoolRun YAML (default: {SPEC_MOUNT_PATH}, where the operator mounts it)")
    common(everything)
    from retool.cli.check import register_check

    register_check(actions)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def run(args: argparse.Namespace) -> int:
    from retool.data import prepare_eval, prepare_rl, prepare_run, prepare_sft

    options: dict = {"split": args.split, "s3_endpoint": args.s3_endpoint}
    if args.max_malformed_fraction is not None and args.kind != "all":
        options["max_malformed_fraction"] = args.max_malformed_fraction
    try:
        if args.kind == "sft":
            summaries = [prepare_sft(args.source, args.out, data_source=args.data_source, rewrite_prompts=not args.keep_prompts, **options)]
        elif args.kind == "rl":
            summaries = [prepare_rl(args.source, args.out, data_source=args.data_source, **options)]
        elif args.kind == "eval":
            summaries = [prepare_eval(args.source, args.out, name=args.name, **options)]
        else:
            _, retool_run = read_run(args.spec, exit_code=1)
            summaries = prepare_run(retool_run, s3_endpoint=args.s3_endpoint, split=args.split, max_malformed_fraction=args.max_malformed_fraction)
    except ValueError as exc:  # an unreadable source, no valid row, too many malformed rows: exit 1 (docs/cli.md)
        raise InputError([line.strip() for line in str(exc).splitlines() if line.strip()], exit_code=1) from None
    if args.json:
        print(json.dumps([s.to_dict() for s in summaries], indent=2, default=str))
    else:
        print("\n".join(s.render() for s in summaries))
    return 0
