"""``python -m retool.runtime.cpu_only -m retool.runtime.import_check [--line 0.9.1]``: every module a stage pod runs imports.

The trainer images run this as a build step (after ``pip check``), so an image whose Python set
holds together only on paper (hydra-core 0.11 resolved in place of 1.3, a missing extra, a
numpy that a compiled dependency was not built for) fails to build instead of failing minutes
into a stage on the cluster. It runs on the build machine, which has no accelerator: through
``retool.runtime.cpu_only`` no device backend is loaded. ``--line`` names the image's verl line
(``spec.trainer.verl``, docs/verl-lines.md): each line's stages run other programs and adapters.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from retool.recipe import verl_plugins
from retool.recipe.verl_plugins import v0_9

STAGE_MODULES = (
    # what the stage commands run (retool.recipe.render.common)
    "verl.trainer.main_ppo",
    "verl.trainer.fsdp_sft_trainer",
    "verl.model_merger.fsdp_model_merger",
    "retool.stage",
    "retool.staging.hub",
    "retool.staging.s3",
    "retool.data.run",
    "retool.runtime.ray_torchrun",
    "retool.cli",
    # what verl imports by path from the rendered config
    verl_plugins.DATASET_MODULE,
    verl_plugins.TOOL_MODULE,
    f"{verl_plugins.__name__}.reward",
)
"""The 0.6 line's (verl 0.6.1)."""

STAGE_MODULES_0_9 = (
    # what the 0.9 line's stage commands run (retool.recipe.render.v0_9)
    "verl.trainer.main_ppo",
    "verl.trainer.main_ppo_v0",
    v0_9.SFT_MODULE,
    "verl.model_merger.fsdp_model_merger",
    "retool.stage",
    "retool.staging.hub",
    "retool.staging.s3",
    "retool.data.run",
    "retool.runtime.ray_torchrun",
    "retool.cli",
    v0_9.PPO_MAIN_MODULE,
    f"{v0_9.__name__}.agent_loop",
    # what verl 0.9.1 imports by path from the rendered config
    verl_plugins.DATASET_MODULE,
    verl_plugins.TOOL_MODULE,
    f"{verl_plugins.__name__}.reward",
)
MODULES = {"0.6.1": STAGE_MODULES, "0.9.1": STAGE_MODULES_0_9}

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.runtime.import_check")
    parser.add_argument("--line", choices=sorted(MODULES), default="0.6.1", help="the image's verl line (spec.trainer.verl)")
    modules = MODULES[parser.parse_args(argv).line]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # report every broken module, not only the first
            failed.append(f"{name}: {type(err).__name__}: {err}")
    for line in failed:
        log.error("cannot import %s", line)
    if not failed:
        log.info("all %d stage modules import", len(modules))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
