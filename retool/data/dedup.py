"""Deduplication by digest: memory grows with the number of UNIQUE prompts (~17k), not with rows (1.79M)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


def digest(text: str) -> bytes:
    """16-byte BLAKE2b of the text: collisions are negligible at millions of prompts, memory stays small."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def question_key(question: str) -> str:
    """What makes two questions the same: their words, whatever the whitespace around them."""
    return " ".join(question.split())


@dataclass
class QuestionDeduplicator:
    """Keeps the first row of each question; a repeat with a different answer is counted as a conflict.

    Conflicting repeats are not silently resolved: they are counted and the first few are logged,
    so a dirty source shows up in the summary.
    """

    answers: dict[bytes, bytes] = field(default_factory=dict)
    duplicates: int = 0
    conflicts: int = 0

    def admit(self, question: str, ground_truth: str, where: str) -> bool:
        key = digest(question_key(question))
        answer = digest(ground_truth.strip())
        seen = self.answers.get(key)
        if seen is None:
            self.answers[key] = answer
            return True
        self.duplicates += 1
        if seen != answer:
            self.conflicts += 1
            if self.conflicts <= 5:
                logger.warning("%s: repeated question with a different answer %r; keeping the first", where, ground_truth)
        return False
