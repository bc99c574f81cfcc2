"""Benchmark: `retool data prepare rl` on a generated DAPO-Math-17k-shaped parquet.

The public DAPO-Math-17k copy holds ~1.79M rows that are ~17.9k distinct prompts repeated ~100 times.
This generates a file of that shape (distinct problems of realistic length wrapped in DAPO's own
answer instruction, repeats interleaved across the file, a distinct extra_info.index per row, a
handful of malformed rows), then runs the CLI in a child process and reports its wall time and peak
RSS (the child's ru_maxrss). Targets: < 60 s and < 2 GB.

    python bench/bench_data_prep.py [--rows 1790000] [--unique 17917] [--dir /tmp/retool-bench]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer "
    "(without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
WORDS = ["let", "triangle", "circle", "integer", "prime", "sum", "product", "find", "the", "number", "of", "real", "roots", "polynomial", "sequence", "probability"]


def unique_problems(count: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    problems, answers = [], []
    for i in range(count):
        words = rng.choice(WORDS, size=int(rng.integers(30, 90)))
        problems.append(f"Problem {i}: " + " ".join(words) + f" $x^{i % 7} + {i}$ ?")
        answers.append(str(int(rng.integers(0, 100000))))
    return problems, answers


def generate(path: Path, rows: int, unique: int, malformed: int = 7, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    problems, answers = unique_problems(unique, rng)
    prompt_type = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    base_prompts = pa.array([[{"content": DAPO_PREFIX + p + DAPO_SUFFIX, "role": "user"}] for p in problems], type=prompt_type)
    base_truth = pa.array(answers, type=pa.string())
    schema = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", prompt_type),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
            ("extra_info", pa.struct([("index", pa.string())])),
        ]
    )
    chunk = 100_000
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            pick = pa.array(rng.integers(0, unique, size=n))
            truth = base_truth.take(pick)
            if start == 0:  # a few rows with no ground truth: must be reported, not dropped
                truth = pa.array([None] * malformed + truth.to_pylist()[malformed:], type=pa.string())
            table = pa.table(
                {
                    "data_source": pa.array(["math_dapo"] * n),
                    "prompt": base_prompts.take(pick),
                    "ability": pa.array(["MATH"] * n),
                    "reward_model": pa.StructArray.from_arrays([truth, pa.array(["rule"] * n)], names=["ground_truth", "style"]),
                    "extra_info": pa.StructArray.from_arrays([pa.array([f"id-{start + i}" for i in range(n)])], names=["index"]),
                },
                schema=schema,
            )
            writer.write_table(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_790_000)
    parser.add_argument("--unique", type=int, default=17_917)
    parser.add_argument("--dir", default="/tmp/retool-bench-data")
    args = parser.parse_args()
    workdir = Path(args.dir)
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / f"dapo-{args.rows}.parquet"
    if not source.exists():
        started = time.monotonic()
        generate(source, args.rows, args.unique)
        print(f"generated {source} ({source.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.1f} s")
    out = workdir / "rl.parquet"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    load_before = os.getloadavg()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "retool.cli", "data", "prepare", "rl", "--source", str(source), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(result.stdout + result.stderr)
    if result.returncode != 0:
        return result.returncode
    written = pq.ParquetFile(out).metadata.num_rows
    print(f"rows {args.rows}, unique {args.unique}, written {written}")
    print(f"wall {wall:.1f} s (target < 60), peak RSS {peak_rss_mib:.0f} MiB (target < 2048)")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}, cores {os.cpu_count()}")
    return 0 if wall < 60 and peak_rss_mib < 2048 else 1


if __name__ == "__main__":
    sys.exit(main())
