"""Benchmark: the preflight's ``model`` check (config.json + the tokenizer's size against the run) on the 32B example.

Reads Qwen2.5-32B-Instruct's config.json shape (written beside Qwen's tokenizer files, as in the
staged model directory) and times ``retool.preflight.model.check_model`` with the tokenizer already
loaded (the preflight loads it once for every check), the training memory estimate of every phase
included. Goal: under 1 s (issue 29).

    python bench/bench_model_check.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_preflight import tokenizer_dir  # noqa: E402
from retool.preflight.model import check_model  # noqa: E402
from retool.spec.validate import parse_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    spec = parse_run(yaml.safe_load((REPO / "examples" / "retoolrun-qwen32b-h200.yaml").read_text())).spec
    with tempfile.TemporaryDirectory() as tmp:
        model = tokenizer_dir(Path(tmp) / "model")
        tokenizer = AutoTokenizer.from_pretrained(model)
        seconds = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = check_model(spec, str(model), tokenizer)
            seconds.append(time.perf_counter() - started)
    print(f"{result.status}: {result.summary}")
    print(f"check_model x{args.repeat}: median {statistics.median(seconds) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
