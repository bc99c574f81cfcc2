"""Compose verl 0.6.1's own Hydra configuration offline, the way its entry points do.

``verl.trainer.main_ppo`` and ``verl.trainer.fsdp_sft_trainer`` are ``@hydra.main`` programs on
``verl/trainer/config``; composing the same config name with the rendered overrides in strict
(struct) mode fails exactly where the real command would: an unknown or misspelled key.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig


def config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations, "verl is not installed"
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def compose_verl(config_name: str, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))
