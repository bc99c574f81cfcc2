"""Is a tokenizer source loadable at all? Said in one line before transformers is asked.

transformers reads any string it cannot open as a directory as a Hugging Face repo id, so a
mistyped or not yet staged directory fails with ``HFValidationError: Repo id must be in the form
...``, and a directory without tokenizer files with a ``TypeError`` deep inside a tokenizer class.
Neither says what is wrong; ``tokenizer_source_problem`` does.
"""

from __future__ import annotations

import re
from pathlib import Path

VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
"""One of these holds a tokenizer's vocabulary (fast tokenizers: tokenizer.json; SentencePiece: *.model; BPE/WordPiece: vocab.*)."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$|^[A-Za-z0-9][\w.-]*$")
"""A Hugging Face repo id as its validator accepts it: ``name`` or ``org/name`` (no path prefix)."""


def tokenizer_source_problem(source: str) -> str | None:
    """Why ``source`` (a directory or a hub id) cannot be a tokenizer, or None when it may be one.

    A directory must hold a vocabulary file; anything that is not a directory here and not a hub
    id is a missing directory (a hub id that does not exist is left to the hub to report).
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if any((path / name).is_file() for name in VOCABULARY_FILES):
            return None
        return f"{source} has no tokenizer files (expected one of {', '.join(VOCABULARY_FILES)}, with tokenizer_config.json)"
    if path.exists():
        return f"{source} is a file; expected a directory with the model's tokenizer files"
    if source.startswith(("/", ".", "~")) or not HUB_ID.match(source):
        return f"{source}: no such directory (expected the model's tokenizer files there, or a Hugging Face id org/name)"
    return None
