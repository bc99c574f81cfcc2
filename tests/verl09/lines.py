"""The render cases of tests/render on the 0.9 line: every example and variant, with ``spec.trainer.verl: "0.9.1"``,
and the CPU rehearsal's (``hardware.accelerator: cpu``, which runs on this line only)."""

from __future__ import annotations

import functools

from retool.recipe.render.command import StageCommand
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from tests.render.cases import VARIANTS, _variant, context_of

HYDRA_STAGES = ("sft", "rl", "eval")

CPU_CHANGES = (("hardware.accelerator", "cpu"), ("hardware.product", None), ("rl.rolloutEngine", "hf"))
LINE_VARIANTS = {
    **VARIANTS,
    "smoke-on-cpu": _variant("smoke-qwen0.5b", *CPU_CHANGES),
    "smoke-on-cpu-ppo": _variant("smoke-qwen0.5b", *CPU_CHANGES, ("rl.algorithm", "ppo")),
}
"""Every 0.6 case, and the CPU rehearsal's shape of the smoke example (GRPO and PPO)."""


def run_on(variant: str, line: str) -> RetoolRun:
    doc = LINE_VARIANTS[variant]()
    doc["spec"].setdefault("trainer", {})["verl"] = line
    return parse_run(doc)


@functools.cache
def rendered(variant: str, stage: str, line: str = "0.9.1") -> StageCommand:
    run = run_on(variant, line)
    return render_stage(run, stage, context_of(run))


CASES = [(variant, stage) for variant in LINE_VARIANTS for stage in HYDRA_STAGES if stage in enabled_stages(run_on(variant, "0.9.1"))]
PPO_CASES = [case for case in CASES if case[1] != "sft"]
BOTH_LINES_CASES = [case for case in CASES if case[0] in VARIANTS]
"""The cases that exist on both lines (a CPU run is 0.9 only)."""
BOTH_LINES_PPO_CASES = [case for case in BOTH_LINES_CASES if case[1] != "sft"]
