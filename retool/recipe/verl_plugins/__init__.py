"""What verl imports by path inside its own processes, and the one definition of those paths.

verl 0.6.1 loads these things of ours by name or file path: the RL dataset class
(``data.custom_cls``, ``pkg://`` module + class), the reward function (``custom_reward_function``,
a file path + function name, loaded under the module name ``custom_module``) and the tool class
(``class_name`` in the tool-config YAML), the tool agent loop (``agent_loop_config_path``); and the rl and eval
stages run verl's ``main_ppo`` through our module, which swaps in our trainer. The renderers take these paths from here, derived from
this package's own name and location, so moving a module cannot leave a stale path in a rendered
command. This module imports nothing from verl: ``retool render`` uses it without the training
stack.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = __name__
_DIR = Path(__file__).resolve().parent

DATASET_MODULE = f"{_PACKAGE}.dataset"
DATASET_CLASS_NAME = "RetoolRLDataset"
DATASET_CLASS_PATH = f"pkg://{DATASET_MODULE}"
"""``data.custom_cls.path``: verl imports ``pkg://`` paths as modules (instances must pickle)."""

REWARD_FILE = str(_DIR / "reward.py")
"""``custom_reward_function.path``: an absolute file path in the installed package."""
REWARD_FUNCTION_NAME = "compute_score"

TOOL_MODULE = f"{_PACKAGE}.tool"
TOOL_CLASS = f"{TOOL_MODULE}.CodeInterpreterTool"
"""``class_name`` of the code-interpreter tool in the tool-config YAML."""

AGENT_LOOP_CONFIG = str(_DIR / "agent_loops.yaml")
"""``actor_rollout_ref.rollout.agent.agent_loop_config_path``: registers :mod:`.agent_loop` as ``tool_agent``."""

PPO_MAIN_MODULE = f"{_PACKAGE}.main_ppo"
"""The rl and eval stages' program: verl's ``main_ppo`` with the trainer of :mod:`.trainer` (tool-use dynamics)."""

TOOL_AGENT = "tool_agent"
"""verl's multi-turn agent loop with tools (``ToolAgentLoop``): the ReTool recipe's rollouts."""
SINGLE_TURN_AGENT = "single_turn_agent"
"""verl's plain generation loop (``SingleTurnAgentLoop``, chat template without tools): the text-only baseline's."""
