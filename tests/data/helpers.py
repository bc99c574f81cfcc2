"""Builders shared by the data tests: DAPO/ReTool/AIME-shaped rows, RetoolRuns prepared on a local directory, a tiny local chat tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer "
    "(without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

# A Qwen2.5-style chat template with tool support, written for these tests: tools in the system
# block, tool calls as <tool_call> JSON with arguments rendered by tojson, tool outputs as user turns.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer():
    """A byte-level BPE tokenizer trained here on a few sentences: every string encodes, nothing downloads."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "Solve the problem. Please reason step by step, and put your final answer within \\boxed{}.",
        'def f(x): return x * 2\nprint(f(21))\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}',
        "<tool_call> </tool_call> <tool_response> </tool_response> <answer> </answer> system user assistant",
    ] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1, special_tokens=SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def dapo_row(problem: str, answer: Any, *, index: str = "id-0", data_source: str = "math_dapo", wrap: bool = True) -> dict[str, Any]:
    content = DAPO_PREFIX + problem + DAPO_SUFFIX if wrap else problem
    return {
        "data_source": data_source,
        "prompt": [{"content": content, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": index},
    }


RETOOL_TEXT = (
    "Let me compute the sum with code.\n<code>\n```python\nprint(sum(range(10)))\n```\n</code>\n"
    "<interpreter>\n45\n</interpreter>\n"
    "So the sum is 45. Now double it.\n<code>\n```python\nx = 45 * 2\nprint(x)\n```\n</code>\n<interpreter>90</interpreter>\n"
    "The result is 90.\n<answer>\n\\boxed{90}\n</answer>"
)


def retool_row(text: str = RETOOL_TEXT, question: str = "What is twice the sum of 0..9?") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": text}]}


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows are dicts (written as JSON) or raw strings (written verbatim, e.g. broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def run_document(
    mount_path: Path, data_sources: dict[str, Any], *, name: str = "demo", namespace: str | None = "team-a", claim: str | None = "data", **spec: Any
) -> dict[str, Any]:
    """A RetoolRun whose PVC layout lies under the local ``mount_path``, reading ``data_sources`` (spec.data);
    ``spec`` adds or replaces other spec fields."""
    pvc = {"mountPath": str(mount_path), **({"claimName": claim} if claim else {})}
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": metadata, "spec": {"storage": {"pvc": pvc}, "data": data_sources, **spec}}
