"""The reward entry file verl loads by path (``custom_reward_function.path``).

verl executes this file under the module name ``custom_module`` and takes ``compute_score`` from
it, so it holds absolute imports only; the reward itself is :mod:`retool.recipe.reward.score`.
"""

from retool.recipe.reward.score import compute_score

__all__ = ["compute_score"]
