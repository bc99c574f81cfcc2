"""Benchmark: the ``retool eval`` loop's own cost, with an instant endpoint and the real sandbox.

A scripted OpenAI-compatible endpoint on 127.0.0.1 answers at once (each sample: two tool calls,
a sympy factorisation and a sum, then a boxed answer quoting the last output), so what is
measured is the harness: HTTP round trips, two sandbox executions per sample, scoring, jsonl
writing. A real model takes seconds per turn; the harness must stay far below that.

    python bench/bench_eval_loop.py [--problems 48] [--concurrency 1 4 16] [--sandbox-workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retool.embedded.servers import sandbox_server  # noqa: E402
from retool.evaluate.app import EvalConfig, run_eval  # noqa: E402
from tests.evaluate.scripted_endpoint import Call, Say, ScriptedEndpoint, ServerThread, build_app  # noqa: E402

MODEL = "bench"


def workload(problems: int) -> tuple[list[dict], dict]:
    rows, scripts = [], {}
    for i in range(problems):
        marker = f"[p{i}]"
        rows.append({"problem": f"{marker} What is the sum of 0..{10**5 + i - 1}?", "answer": str(sum(range(10**5 + i)))})
        scripts[marker] = [
            Call("import sympy as sp\nsp.factorint(2**32 + 1)"),
            Call(f"sum(range({10**5 + i}))"),
            Say("\\boxed{{last}}"),
        ]
    return rows, scripts


async def one_level(url: str, sandbox_url: str, data: Path, concurrency: int, out: Path) -> dict:
    config = EvalConfig(endpoint=url, model=MODEL, data=data, n=1, max_turns=4, concurrency=concurrency, sandbox_url=sandbox_url, out=out)
    started = time.monotonic()
    outcome = await run_eval(config)
    wall = time.monotonic() - started
    latencies = sorted(r.elapsed_s for r in outcome.results)
    tool_seconds = [r.tool_seconds / max(r.tool_calls, 1) for r in outcome.results]
    return {
        "concurrency": concurrency,
        "samples": len(outcome.results),
        "wall_s": round(wall, 2),
        "samples_per_s": round(len(outcome.results) / wall, 2),
        "tool_calls_per_s": round(sum(r.tool_calls for r in outcome.results) / wall, 2),
        "sample_p50_ms": round(1000 * statistics.median(latencies), 1),
        "sample_p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
        "tool_call_mean_ms": round(1000 * statistics.fmean(tool_seconds), 1),
        # Per sample, everything but the sandbox: three chat round trips, parsing, the loop itself.
        "non_tool_ms_per_sample": round(1000 * statistics.fmean(r.elapsed_s - r.tool_seconds for r in outcome.results), 1),
        "accuracy": outcome.summary["val-core/aime/acc/mean@1"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sandbox-workers", type=int, default=2)
    args = parser.parse_args()
    rows, scripts = workload(args.problems)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "bench.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        with sandbox_server(Path(tmp) / "logs", workers=args.sandbox_workers) as sandbox:
            for concurrency in args.concurrency:
                endpoint = ScriptedEndpoint(model=MODEL, scripts=scripts)
                with ServerThread(build_app(endpoint)) as server:
                    figures = asyncio.run(one_level(server.url, sandbox.base_url, data, concurrency, Path(tmp) / f"c{concurrency}.jsonl"))
                print(json.dumps(figures))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
