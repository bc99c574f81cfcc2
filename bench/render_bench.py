"""How long rendering and offline verification take per stage (what `retool render` and the tests cost).

    .venv/bin/python bench/render_bench.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retool.recipe.render.command import hydra_overrides
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.runtime.context import StageContext
from retool.spec.names import sandbox_url
from retool.spec.validate import parse_run
from tests.render.verl_config import compose_verl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "retoolrun-qwen32b-h200.yaml"


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    run = parse_run(yaml.safe_load(EXAMPLE.read_text()))
    ctx = StageContext(run_name=run.metadata.name, namespace="retool", sandbox_url=sandbox_url(run.metadata.name, "retool"), mlflow_tracking_uri="http://mlflow:5000")
    print(f"{'stage':8} {'render ms':>10} {'overrides':>10} {'compose ms':>11}")
    for stage in enabled_stages(run):
        command = render_stage(run, stage, ctx)
        render_ms = timed(lambda stage=stage: render_stage(run, stage, ctx), 200) * 1000
        compose_ms = (
            timed(lambda command=command: compose_verl(command.config_name, hydra_overrides(command.overrides)), 10) * 1000 if command.config_name else float("nan")
        )
        print(f"{stage:8} {render_ms:10.2f} {len(command.overrides):10d} {compose_ms:11.1f}")


if __name__ == "__main__":
    main()
