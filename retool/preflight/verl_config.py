"""The rendered stage commands composed into verl's own Hydra config, as the stages will run them.

``verl.trainer.main_ppo`` and ``verl.trainer.fsdp_sft_trainer`` are ``@hydra.main`` programs on
``verl/trainer/config``. Composing the same config name with a stage's rendered overrides (strict
mode: an unknown key fails) gives the exact ``DictConfig`` the stage's program would get; the
preflight then changes only what it must to run on a CPU pod before any model exists:

- ``actor_rollout_ref.model.path`` -> the tokenizer directory (the agent loop and the reward worker
  read nothing else from the model path; the RL model itself is written by later stages),
- the tool config -> a copy of the rendered file in the preflight's work directory,
- ``trainer.logger`` -> console, rollout traces off, a stage's validation dump into the work directory: a
  preflight writes nothing into the run's experiment or PVC layout except its own report.
"""

from __future__ import annotations

import importlib.util
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from retool.recipe.render.command import StageCommand, hydra_overrides

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
VALIDATION_DIR_KEY = "trainer.validation_data_dir"
WATCH_SHARE_KEY = "+retool.reward_watch.share"


def config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed (the preflight runs in the trainer image)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def compose_verl(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """verl's config ``config_name`` with ``overrides``, composed as its entry point composes it."""
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def stage_files(command: StageCommand, work_dir: Path) -> dict[str, str]:
    """Write the command's files (the tool config) under ``work_dir``; returns rendered path -> copy."""
    copies = {}
    for rendered_path, content in command.files.items():
        target = work_dir / command.stage / posixpath.basename(rendered_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        copies[rendered_path] = str(target)
    return copies


def preflight_overrides(command: StageCommand, *, tokenizer: str, file_copies: Mapping[str, str], work_dir: Path) -> dict[str, Any]:
    """What the preflight changes in a PPO stage's config (see the module docstring)."""
    overrides: dict[str, Any] = {
        "actor_rollout_ref.model.path": tokenizer,
        "trainer.logger": ["console"],
        "actor_rollout_ref.rollout.trace.backend": None,
    }
    if WATCH_SHARE_KEY in command.overrides:
        overrides[WATCH_SHARE_KEY] = 0.0  # no math-verify process for a preflight's handful of scripted rollouts
    if command.overrides.get(VALIDATION_DIR_KEY):
        overrides[VALIDATION_DIR_KEY] = str(work_dir / command.stage / "validation")
    tool_config = command.overrides.get(TOOL_CONFIG_KEY)
    if isinstance(tool_config, str) and tool_config in file_copies:
        overrides[TOOL_CONFIG_KEY] = file_copies[tool_config]
    return overrides


def compose_stage(command: StageCommand, extra: Mapping[str, Any] | None = None) -> DictConfig:
    """The stage's composed config: its rendered overrides, then ``extra`` (Hydra errors propagate)."""
    if command.config_name is None:
        raise ValueError(f"the {command.stage} stage is not a verl Hydra program")
    merged = {**command.overrides, **(extra or {})}
    config = compose_verl(command.config_name, hydra_overrides(merged))
    OmegaConf.resolve(config)
    return config
