"""``retool eval``: tool-integrated evaluation of a model behind an OpenAI-compatible chat API.

    retool eval --endpoint http://vllm:8000 --model retool-32b --data aime_2024.parquet -n 30

Every problem is sampled ``-n`` times with the code-interpreter loop of training (tool calls run
in our sandbox: the one at ``--sandbox-url``, else an embedded one started on 127.0.0.1), scored
with the training reward; results go to a jsonl file (one line per sample), the summary to a
JSON file next to it (``--out``, default ``build/eval/<model>-<data>.jsonl``) and to MLflow when
``--mlflow-uri`` is given. A sample that failed at the endpoint is counted (``eval/errors``), not
scored. Exit 1 when any sample failed to complete (the endpoint kept failing), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from retool.cli.sandboxed import add_sandbox_arguments, run_reading_file, sandbox_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a served model on AIME-format data with the code-interpreter loop",
        description="Evaluate any model behind an OpenAI-compatible /v1/chat/completions endpoint with the ReTool code-interpreter loop.",
    )
    parser.add_argument("--endpoint", required=True, help="base URL of the OpenAI-compatible server (http://host:8000 or .../v1)")
    parser.add_argument("--model", required=True, help="model name the server serves")
    parser.add_argument("--data", required=True, type=Path, help="AIME-format problems: parquet/jsonl/json rows with prompt and reward_model.ground_truth (or problem/answer)")
    parser.add_argument("-n", type=int, default=1, help="samples per problem (mean@n, maj@n, best@n); default 1")
    parser.add_argument("--max-turns", type=int, default=8, help="assistant turns per sample (the RL recipe's maxTurns); default 8")
    parser.add_argument("--max-parallel-calls", type=int, default=1, help="tool calls run per turn, the rest dropped (verl's max_parallel_calls); default 1, as in RL")
    parser.add_argument("--concurrency", type=int, default=16, help="conversations (hence requests) in flight at once; default 16")
    parser.add_argument("--temperature", type=float, default=1.0, help="default 1.0 (the recipe's eval setting)")
    parser.add_argument("--top-p", type=float, default=0.6, help="default 0.6 (the recipe's eval setting)")
    parser.add_argument("--max-tokens", type=int, default=None, help="per request; default: the server's")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per chat request; default 600")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    parser.add_argument("--max-output-chars", type=int, default=4096, help="longest tool output shown to the model (head and tail kept); default 4096, as in RL")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="per-sample results (jsonl); the summary goes to <out>.summary.json (default: build/eval/<model>-<data file name>.jsonl)",
    )
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"), help="log params, metrics and results to this MLflow server (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--experiment", default="retool-eval", help="MLflow experiment; default retool-eval")
    parser.add_argument("--run-name", default=None, help="MLflow run name; default <model>-<data file>")
    add_sandbox_arguments(parser, per="code execution", log_dir=Path("build/eval"))
    parser.set_defaults(func=run)


def default_out(model: str, data: Path) -> Path:
    """Where results go without ``--out``: under build/ (beside the embedded sandbox's logs), named
    after what was evaluated, so runs of other models or data sets never overwrite each other and
    nothing lands loose in the working directory."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model}-{data.stem}").strip("-.")
    return Path("build/eval") / f"{name or 'results'}.jsonl"


def run(args: argparse.Namespace) -> int:
    from retool.evaluate.app import EvalConfig, run_eval

    for flag, value in (("-n", args.n), ("--max-turns", args.max_turns), ("--max-parallel-calls", args.max_parallel_calls), ("--concurrency", args.concurrency)):
        if value < 1:
            print(f"retool eval: {flag} must be at least 1", file=sys.stderr)
            return 2
    config = EvalConfig(
        endpoint=args.endpoint,
        model=args.model,
        data=args.data,
        n=args.n,
        max_turns=args.max_turns,
        max_parallel_calls=args.max_parallel_calls,
        concurrency=args.concurrency,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
        limit=args.limit,
        max_output_chars=args.max_output_chars,
        out=args.out or default_out(args.model, args.data),
        mlflow_uri=args.mlflow_uri,
        experiment=args.experiment,
        run_name=args.run_name,
        **sandbox_config(args),
    )
    outcome = run_reading_file("retool eval", run_eval(config, progress=sys.stderr.isatty()))
    if outcome is None:
        return 2
    print(json.dumps(outcome.summary, indent=2))
    print(f"results: {outcome.results_path}", file=sys.stderr)
    print(f"summary: {outcome.summary_path}", file=sys.stderr)
    if outcome.mlflow:
        print(f"mlflow:  {outcome.mlflow.url}", file=sys.stderr)
    errors = int(outcome.summary.get("eval/errors", 0))
    if errors:
        print(f"retool eval: {errors} sample(s) did not complete (see 'error' in {outcome.results_path})", file=sys.stderr)
        return 1
    return 0
