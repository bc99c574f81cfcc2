"""The demo's sample data: SFT trajectories and competition-style problems written for this project.

The problems are original (not taken from AIME), with integer answers in 0..999 as in AIME.
The SFT trajectories are written as reasoning and code; their ``<interpreter>`` outputs are not
written by hand: ``python -m retool.demo.samples`` runs every code block through our sandbox
(the same tool path RL uses) and writes the real outputs into ``data/sft.jsonl``, so the data
check of the demo compares against outputs the sandbox really produced.

The training rehearsal (``retool.rehearsal``) trains a tiny random model on its own, shorter
trajectories (``data/rehearsal_sft.jsonl``, made the same way): one code block, its output and a
boxed answer each, short enough that a 10M-parameter model memorises them in a couple of minutes
on 2 cores. Its RL prompts are the same problems, so that RL's first step can earn a reward.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from retool.embedded.servers import sandbox_server
from retool.evaluate.tools import sandbox_tool

DATA_DIR = Path(__file__).resolve().parent / "data"
SFT_FILE = DATA_DIR / "sft.jsonl"
EVAL_FILE = DATA_DIR / "aime_demo.jsonl"
REHEARSAL_SFT_FILE = DATA_DIR / "rehearsal_sft.jsonl"

INSTRUCTION = (
    "Solve the problem below, reasoning step by step. You may write Python code to check or carry out "
    "calculations: wrap each complete script in <code>\n```python\n...\n```\n</code>; it runs in a sandbox and "
    "its output comes back inside <interpreter>...</interpreter>. End with the final answer as "
    "<answer>\n\\boxed{...}\n</answer>.\n\n*user question:*\n"
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SftSource:
    question: str
    answer: str
    parts: tuple[str, ...]
    """Reasoning text and code, alternating: text, code, text, code, ..., final text."""


SFT_SOURCES: tuple[SftSource, ...] = (
    SftSource(
        question="Find the number of positive integers $n \\le 1000$ such that $n^2 + 1$ is divisible by $5$.",
        answer="400",
        parts=(
            "Squares modulo 5 are 0, 1, 4, so $n^2 + 1 \\equiv 0 \\pmod 5$ exactly when $n^2 \\equiv 4$, "
            "that is when $n \\equiv 2$ or $3 \\pmod 5$. Let me confirm the residues and count directly.",
            "residues = sorted({n % 5 for n in range(1, 26) if (n * n + 1) % 5 == 0})\n"
            "count = sum(1 for n in range(1, 1001) if (n * n + 1) % 5 == 0)\n"
            "print(residues, count)",
            "The residues are 2 and 3 as expected, and each block of five consecutive integers contributes two "
            "values, so there are $2 \\cdot 200 = 400$ of them.\n\n<answer>\n\\boxed{400}\n</answer>",
        ),
    ),
    SftSource(
        question="How many ordered pairs $(a, b)$ of positive integers satisfy $\\frac{1}{a} + \\frac{1}{b} = \\frac{1}{12}$?",
        answer="15",
        parts=(
            "Clearing denominators, $ab - 12a - 12b = 0$, so $(a - 12)(b - 12) = 144$. Both factors must be positive "
            "(if both were negative, $a$ and $b$ would be below 12 and the product at most $11 \\cdot 11 < 144$). "
            "So the pairs correspond to the divisors of 144.",
            "divisors = [d for d in range(1, 145) if 144 % d == 0]\nlen(divisors)",
            "Let me double-check by brute force over a range that must contain every solution ($a \\le 12 + 144$).",
            "pairs = [(a, b) for a in range(13, 157) for b in range(13, 157) if 12 * (a + b) == a * b]\n"
            "print(len(pairs), pairs[:3])",
            "Both methods give 15 ordered pairs.\n\n<answer>\n\\boxed{15}\n</answer>",
        ),
    ),
    SftSource(
        question="A sequence satisfies $a_1 = 1$, $a_2 = 3$ and $a_n = a_{n-1} + 2a_{n-2}$ for $n \\ge 3$. "
        "Find the remainder when $a_{20}$ is divided by $1000$.",
        answer="51",
        parts=(
            "The characteristic roots are 2 and -1, so $a_n = \\alpha 2^n + \\beta(-1)^n$. Rather than solving for the "
            "constants by hand, I will iterate the recurrence.",
            "a = [1, 3]\nfor n in range(3, 21):\n    a.append(a[-1] + 2 * a[-2])\nprint(a[19], a[19] % 1000)\nprint(closed_form(20))",
            "The iteration worked but I called a function I never defined. The closed form should be "
            "$a_n = (2^{n+1} + (-1)^n)/3$; let me check it against the iteration.",
            "from fractions import Fraction\n\n"
            "def closed_form(n):\n    return Fraction(2 ** (n + 1) + (-1) ** n, 3)\n\n"
            "a = [1, 3]\nfor n in range(3, 21):\n    a.append(a[-1] + 2 * a[-2])\n"
            "print(all(closed_form(n) == a[n - 1] for n in range(1, 21)), a[19] % 1000)",
            "The closed form agrees with the recurrence for every term, and $a_{20} = 699051$, "
            "so the remainder is 51.\n\n<answer>\n\\boxed{51}\n</answer>",
        ),
    ),
    SftSource(
        question="How many non-congruent triangles with positive integer side lengths have perimeter $30$?",
        answer="19",
        parts=(
            "Take sides $a \\le b \\le c$ with $a + b + c = 30$. The triangle inequality reduces to $a + b > c$, "
            "i.e. $c < 15$, and $c \\ge 10$ because $c$ is the largest side. Let me enumerate.",
            "import itertools\n\n"
            "triangles = [t for t in itertools.combinations_with_replacement(range(1, 30), 3) if sum(t) == 30 and t[0] + t[1] > t[2]]\n"
            "print(len(triangles))\nprint(min(t[2] for t in triangles), max(t[2] for t in triangles))",
            "There are 19 such triangles, with the largest side between 10 and 14 as predicted.\n\n<answer>\n\\boxed{19}\n</answer>",
        ),
    ),
)

REHEARSAL_SOURCES: tuple[SftSource, ...] = (
    SftSource(
        question="Find the remainder when $2^{100}$ is divided by $7$.",
        answer="2",
        parts=("Let me compute it.", "print(pow(2, 100, 7))", "The remainder is 2.\n\n<answer>\n\\boxed{2}\n</answer>"),
    ),
    SftSource(
        question="Find the sum of the digits of $2^{50}$.",
        answer="76",
        parts=("I will add the digits with code.", "print(sum(int(d) for d in str(2**50)))", "The digit sum is 76.\n\n<answer>\n\\boxed{76}\n</answer>"),
    ),
    SftSource(
        question="How many primes are less than $100$?",
        answer="25",
        parts=("Let me count them.", "import sympy\nprint(len(list(sympy.primerange(100))))", "There are 25.\n\n<answer>\n\\boxed{25}\n</answer>"),
    ),
    SftSource(
        question="Find the number of positive divisors of $720$.",
        answer="30",
        parts=("sympy counts divisors.", "import sympy\nprint(sympy.divisor_count(720))", "So $720$ has 30 divisors.\n\n<answer>\n\\boxed{30}\n</answer>"),
    ),
)
"""The rehearsal's SFT trajectories (and RL prompts): one code block each, answers checked by the sandbox."""

EVAL_PROBLEMS: tuple[tuple[str, str], ...] = (
    ("Let $S$ be the sum of all positive divisors of $432 = 2^4 \\cdot 3^3$. Find the remainder when $S$ is divided by $1000$.", "240"),
    ("Find the remainder when $3^{2026}$ is divided by $1000$.", "329"),
    ("How many subsets of $\\{1, 2, \\ldots, 10\\}$, including the empty set, have a sum of elements divisible by $3$?", "344"),
    ("How many points $(x, y)$ with integer coordinates satisfy $x^2 + y^2 \\le 100$?", "317"),
    ("How many positive integers less than $1000$ have digits that sum to $12$?", "73"),
    ("Find the remainder when $1^3 + 2^3 + \\cdots + 50^3$ is divided by $1000$.", "625"),
)


def sft_row(source: SftSource, outputs: list[str]) -> dict:
    """A row in the published ReTool-SFT layout: [user, assistant] with interleaved code and outputs."""
    texts, codes = source.parts[0::2], source.parts[1::2]
    if len(outputs) != len(codes):
        raise ValueError("one output per code block is needed")
    pieces = [texts[0]]
    for code, output, text in zip(codes, outputs, texts[1:], strict=True):
        pieces.append(f"<code>\n```python\n{code}\n```\n</code>\n<interpreter>\n{output}\n</interpreter>\n{text}")
    return {
        "messages": [
            {"role": "user", "content": INSTRUCTION + source.question},
            {"role": "assistant", "content": "\n".join(pieces)},
        ],
        "answer": source.answer,
    }


def eval_rows() -> list[dict]:
    """AIME-2025-style rows (``problem``, ``answer``), the layout ``retool data prepare eval`` reads."""
    return [{"id": f"demo-{i}", "problem": problem, "answer": answer} for i, (problem, answer) in enumerate(EVAL_PROBLEMS, start=1)]


async def build_sft_rows(run_code: Callable[[str], Awaitable[str]], sources: tuple[SftSource, ...] = SFT_SOURCES) -> list[dict]:
    """Every SFT row of ``sources``, with each code block's output obtained from ``run_code``."""
    rows = []
    for source in sources:
        outputs = [await run_code(code) for code in source.parts[1::2]]
        rows.append(sft_row(source, outputs))
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


async def _regenerate(sandbox_url: str | None, log_dir: Path) -> None:
    async def generate(url: str) -> None:
        async with sandbox_tool(url) as tool:

            async def run_code(code: str) -> str:
                result = await tool.run(code)
                if result.status == "sandbox_error":
                    raise RuntimeError(f"sandbox failed on a sample block: {result.text}")
                return result.text

            write_jsonl(SFT_FILE, await build_sft_rows(run_code))
            write_jsonl(REHEARSAL_SFT_FILE, await build_sft_rows(run_code, REHEARSAL_SOURCES))

    if sandbox_url:
        await generate(sandbox_url)
    else:
        with sandbox_server(log_dir) as server:
            await generate(server.base_url)
    write_jsonl(EVAL_FILE, eval_rows())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the demo's sample files, running every code block in the sandbox.")
    parser.add_argument("--sandbox-url", help="an already running sandbox (default: start an embedded one)")
    parser.add_argument("--log-dir", type=Path, default=Path("build/demo/logs"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    asyncio.run(_regenerate(args.sandbox_url, args.log_dir))
    logger.info("wrote %s, %s and %s", SFT_FILE, REHEARSAL_SFT_FILE, EVAL_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
