"""The demo's data preparation: the shipped samples through the same code the prepare stage runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from retool.data import PrepareSummary, prepare_eval, prepare_sft

logger = logging.getLogger(__name__)

EVAL_NAME = "aime_demo"


@dataclass(frozen=True)
class PreparedData:
    sft: Path
    eval: Path
    summaries: tuple[PrepareSummary, ...]

    def figures(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        for summary in self.summaries:
            figures[f"demo/prepare/{summary.kind}/rows_written"] = float(summary.rows_written)
            figures[f"demo/prepare/{summary.kind}/malformed"] = float(summary.malformed)
        return figures


def prepare_samples(sft_source: Path, eval_source: Path, out_dir: Path, *, progress: bool) -> PreparedData:
    """``sft/train.parquet`` (multi-turn messages with tool calls) and ``eval/aime_demo.parquet`` under ``out_dir``."""
    sft_out, eval_out = out_dir / "sft" / "train.parquet", out_dir / "eval" / f"{EVAL_NAME}.parquet"
    with tqdm(total=2, desc="prepare data", unit="set", disable=not progress) as bar:
        sft = prepare_sft(str(sft_source), str(sft_out))
        bar.update(1)
        evaluation = prepare_eval(str(eval_source), str(eval_out), name=EVAL_NAME)
        bar.update(1)
    for summary in (sft, evaluation):
        if summary.malformed:
            logger.warning("%s: %d malformed rows in the shipped samples", summary.source, summary.malformed)
    return PreparedData(sft=sft_out, eval=eval_out, summaries=(sft, evaluation))
