"""The verl 0.9.1 adapters of the recipe (``spec.trainer.verl: "0.9.1"``), and the paths verl loads them by.

Only what verl 0.9.1 changed lives here; the pure parts (the code-interpreter tool, the reward,
the dataset's prompt filter, the tool-use dynamics, the reward watch) are the 0.6 line's modules,
imported unchanged. What changed, read from verl 0.9.1's source (PyPI ``verl==0.9.1``):

- ``ToolAgentLoop._call_tool(tool_call, tools_kwargs, agent_data)`` (0.6.1: no ``agent_data``), and
  the loop gets its tools through its constructor (``tools=ToolListWrap``), built once per
  ``AgentLoopWorker`` from the same tool-config YAML: :mod:`.agent_loop`.
- ``RayPPOTrainer.reward_fn``/``val_reward_fn`` and ``compute_reward`` are gone: the reward loop
  scores every sample during the rollout and the trainer reads the scores back with
  ``verl.trainer.ppo.reward.extract_reward``: :mod:`.trainer` watches there.
- ``MultiTurnSFTDataset`` tokenizes every message alone and checks the concatenation against the whole
  conversation: :mod:`.sft_dataset` tokenizes each in its conversation, as 0.6.1 did.
- ``verl.trainer.main_ppo`` runs the V1 (TransferQueue) trainer unless ``trainer.use_v1=false``; the
  legacy task runner moved to ``verl.trainer.main_ppo_v0``: :mod:`.main_ppo` (why not V1:
  docs/verl-lines.md).

This module imports nothing from verl: the renderers read these paths without the training stack.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = __name__
_DIR = Path(__file__).resolve().parent

VERL_VERSION = "0.9.1"
"""The verl release this line runs (pyproject ``train-verl09``, images/trainer-*-verl09)."""

PPO_MAIN_MODULE = f"{_PACKAGE}.main_ppo"
"""The rl and eval stages' program on this line: verl 0.9.1's legacy ``main_ppo`` with our trainer."""

AGENT_LOOP_CONFIG = str(_DIR / "agent_loops.yaml")
"""``actor_rollout_ref.rollout.agent.agent_loop_config_path`` on this line: :mod:`.agent_loop` as ``tool_agent``."""

SFT_DATASET_MODULE = f"{_PACKAGE}.sft_dataset"
SFT_DATASET_CLASS_PATH = f"pkg://{SFT_DATASET_MODULE}"
SFT_DATASET_CLASS_NAME = "RetoolSFTDataset"
"""The sft stage's ``data.custom_cls`` on this line: verl 0.9.1's SFT dataset with each message tokenized in
its conversation (0.9.1 tokenizes it alone, which drops Qwen3's reasoning): :mod:`.sft_dataset`."""

SFT_MODULE = "verl.trainer.sft_trainer"
"""verl 0.9.1's SFT trainer (``fsdp_sft_trainer`` was removed), Hydra config ``sft_trainer_engine``."""
SFT_CONFIG_NAME = "sft_trainer_engine"

CPU_MODULE = f"{_PACKAGE}.cpu"
"""What ``VERL_USE_EXTERNAL_MODULES`` loads in every process of a CPU run (``hardware.accelerator: cpu``): :mod:`.cpu`."""
CPU_PLATFORM = "cpu"
"""``VERL_PLATFORM`` of a CPU run: the platform :mod:`.cpu_platform` registers."""
HF_ROLLOUT_ENGINE = "hf"
"""``actor_rollout_ref.rollout.name`` of the rehearsal rollout engine (:mod:`.hf_rollout`)."""
HF_ROLLOUT_ADAPTER = f"{_PACKAGE}.hf_rollout.HFServerAdapter"
"""Its ``BaseRollout`` by dotted path, as verl's in-worker rollout registry holds engines."""
