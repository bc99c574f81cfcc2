"""The rl and eval stages' program: verl 0.6.1's ``main_ppo`` with :class:`RetoolPPOTrainer` as its trainer.

Same Hydra program (verl's ``trainer/config``, config ``ppo_trainer``), same command line, same
``run_ppo``; the only difference is the trainer class the task runner builds. verl offers the hook
for the runner (``run_ppo(config, task_runner_class=...)``, "for recipe to change TaskRunner"), not for
the trainer: ``TaskRunner.run`` builds ``RayPPOTrainer`` by the name bound in ``verl.trainer.main_ppo``.
The task runner is a Ray actor in a process of its own, so :class:`RetoolTaskRunner` binds that name
to our subclass inside that process, then runs verl's ``run`` unchanged.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import hydra
import ray
from verl.trainer import main_ppo as verl_main_ppo

from retool.recipe.verl_plugins.trainer import RetoolPPOTrainer


def _verl_config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


class RetoolTaskRunner(verl_main_ppo.TaskRunner):
    """verl's ``TaskRunner`` whose ``run`` builds :class:`RetoolPPOTrainer`."""

    def run(self, config: Any) -> None:
        verl_main_ppo.RayPPOTrainer = RetoolPPOTrainer  # this actor's process only (see the module docstring)
        super().run(config)


@hydra.main(config_path=_verl_config_dir(), config_name="ppo_trainer", version_base=None)
def main(config: Any) -> None:
    verl_main_ppo.run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(RetoolTaskRunner))


if __name__ == "__main__":
    main()
