"""Tiny raw data sets in the shapes the public ones have, and RetoolRuns that point at them.

``retool data prepare all`` turns them into the run's parquet files, as the prepare stage does on a
cluster: DAPO-Math-style RL rows (more than the largest example's batch of 512, since verl's train
dataloader drops an incomplete batch), ReTool-SFT trajectories with ``<code>``/``<interpreter>``
text, and AIME-style eval sets named as each example names them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.data.helpers import dapo_row, retool_row, write_jsonl, write_parquet

RL_ROWS = 600
SFT_ROWS = 24
EVAL_ROWS = 4


def write_sources(directory: Path, eval_names: list[str]) -> dict[str, Any]:
    """Raw sources under ``directory``; returns the ``spec.data`` that reads them."""
    rl = write_parquet(directory / "dapo.parquet", [dapo_row(f"What is {i} + {i + 1}?", str(2 * i + 1), index=f"dapo-{i}") for i in range(RL_ROWS)])
    sft = write_jsonl(directory / "retool_sft.jsonl", [retool_row(question=f"What is twice the sum of 0..9? (variant {i})") for i in range(SFT_ROWS)])
    evals = []
    for name in eval_names:
        rows = [{"Problem": f"{name} problem {i}: what is {i} squared plus one?", "Answer": str(i * i + 1)} for i in range(EVAL_ROWS)]
        evals.append({"name": name, "source": str(write_jsonl(directory / f"{name}.jsonl", rows))})
    return {"sft": str(sft), "rl": str(rl), "eval": evals}


def local_run(document: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The RetoolRun with its data read from local sources and its PVC layout under ``directory``."""
    document = copy.deepcopy(document)
    spec = document["spec"]
    names = [e["name"] for e in spec.get("data", {}).get("eval", [])] or ["aime_2024", "aime_2025"]
    spec["data"] = write_sources(directory / "sources", names)
    spec.setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(directory / "pvc")
    return document


def write_run(document: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path
