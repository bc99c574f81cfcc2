"""The rl and eval stages' program on the 0.9 line: verl 0.9.1's ``main_ppo`` on its legacy trainer, with ours.

Same Hydra program as ``verl.trainer.main_ppo`` (config ``ppo_trainer`` in verl's ``trainer/config``,
``validate_config`` first), the same ``run_ppo``. verl 0.9.1 runs the V1 (TransferQueue) trainer when
``trainer.use_v1`` is true (its default) and the legacy ``verl.trainer.main_ppo_v0.TaskRunner`` +
``RayPPOTrainer`` otherwise; the renderer sets ``trainer.use_v1=false`` (why: docs/verl-lines.md) and
this program refuses a config that does not, instead of silently running a trainer without our
dynamics and reward watch.

``main_ppo_v0.TaskRunner`` is a Ray actor class (``@ray.remote``) that builds ``RayPPOTrainer`` by the
name bound in ``main_ppo_v0``. :class:`RetoolTaskRunner` is an actor of its own that, inside its
process, binds that name to :class:`RetoolPPOTrainer` and runs verl's unchanged ``run`` on an
instance of the class Ray wrapped (``__ray_metadata__.modified_class``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import hydra
import ray
from verl.trainer import main_ppo as verl_main_ppo
from verl.trainer import main_ppo_v0
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from retool.recipe.verl_plugins.v0_9.trainer import RetoolPPOTrainer


def _verl_config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def legacy_task_runner_class() -> type:
    """The class under verl's ``@ray.remote`` ``TaskRunner`` (Ray keeps it as ``__ray_metadata__.modified_class``)."""
    return main_ppo_v0.TaskRunner.__ray_metadata__.modified_class


class RetoolTaskRunner:
    """Runs verl 0.9.1's legacy ``TaskRunner.run`` with :class:`RetoolPPOTrainer` (see the module docstring)."""

    def run(self, config: Any) -> None:
        main_ppo_v0.RayPPOTrainer = RetoolPPOTrainer  # this actor's process only
        legacy_task_runner_class()().run(config)


class V1TrainerError(ValueError):
    """The config asks for verl's V1 trainer, which this program does not run."""


def check_legacy_trainer(config: Any) -> None:
    if config.trainer.get("use_v1", True):
        raise V1TrainerError("trainer.use_v1 is true: the ReTool 0.9 line runs verl 0.9.1's legacy trainer (trainer.use_v1=false, docs/verl-lines.md)")


@hydra.main(config_path=_verl_config_dir(), config_name="ppo_trainer", version_base=None)
def main(config: Any) -> None:
    check_legacy_trainer(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=verl_main_ppo.need_reference_policy(config), use_critic=verl_main_ppo.need_critic(config))
    verl_main_ppo.run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(RetoolTaskRunner))


if __name__ == "__main__":
    main()
