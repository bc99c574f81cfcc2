"""``python -m retool.runtime.cpu_only -m retool.runtime.import_check``: every module a stage pod runs imports.

The trainer images run this as a build step (after ``pip check``), so an image whose Python set
holds together only on paper (hydra-core 0.11 resolved in place of 1.3, a missing extra, a
numpy that a compiled dependency was not built for) fails to build instead of failing minutes
into a stage on the cluster. It runs on the build machine, which has no accelerator: through
``retool.runtime.cpu_only`` no device backend is loaded.
"""

from __future__ import annotations

import importlib
import logging
import sys

from retool.recipe import verl_plugins

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

log = logging.getLogger(__name__)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    failed = []
    for name in STAGE_MODULES:
        try:
            importlib.import_module(name)
        except Exception as err:  # report every broken module, not only the first
            failed.append(f"{name}: {type(err).__name__}: {err}")
    for line in failed:
        log.error("cannot import %s", line)
    if not failed:
        log.info("all %d stage modules import", len(STAGE_MODULES))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
