"""A tiny real model (transformers' own save_pretrained output) for the staging tests."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_model_files(directory: Path) -> dict[str, bytes]:
    """config.json, generation_config.json and model.safetensors of a one-layer Qwen2 (a few KB)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory, safe_serialization=True)
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    files = tiny_model_files(tmp_path_factory.mktemp("tiny-model"))
    # What hub repositories also hold: a model card, git attributes, and the same weights in a second format.
    return {**files, "README.md": b"# tiny\n", ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", "pytorch_model.bin": b"\0" * 4096}
