"""The render cases of tests/render on the 0.9 line: every example and variant, with ``spec.trainer.verl: "0.9.1"``."""

from __future__ import annotations

import functools

from retool.recipe.render.command import StageCommand
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from tests.render.cases import VARIANTS, context_of

HYDRA_STAGES = ("sft", "rl", "eval")


def run_on(variant: str, line: str) -> RetoolRun:
    doc = VARIANTS[variant]()
    doc["spec"].setdefault("trainer", {})["verl"] = line
    return parse_run(doc)


@functools.cache
def rendered(variant: str, stage: str, line: str = "0.9.1") -> StageCommand:
    run = run_on(variant, line)
    return render_stage(run, stage, context_of(run))


CASES = [(variant, stage) for variant in VARIANTS for stage in HYDRA_STAGES if stage in enabled_stages(run_on(variant, "0.9.1"))]
PPO_CASES = [case for case in CASES if case[1] != "sft"]
