"""What verl imports by path inside its own processes, and the one definition of those paths.

verl 0.6.1 loads three things of ours by name or file path: the RL dataset class
(``data.custom_cls``, ``pkg://`` module + class), the reward function (``custom_reward_function``,
a file path + function name, loaded under the module name ``custom_module``) and the tool class
(``class_name`` in the tool-config YAML). The renderers take these paths from here, derived from
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

TOOL_AGENT = "tool_agent"
"""verl's multi-turn agent loop with tools (``ToolAgentLoop``): the ReTool recipe's rollouts."""
SINGLE_TURN_AGENT = "single_turn_agent"
"""verl's plain generation loop (``SingleTurnAgentLoop``, chat template without tools): the text-only baseline's."""
