"""The reward entry file verl loads by path (``custom_reward_function.path``).

verl executes this file under the module name ``custom_module`` and takes ``compute_score`` from
it, so it holds absolute imports only; the reward itself is :mod:`retool.recipe.reward.score`.

Loading it is the reward manager's start (verl 0.6.1 ``verl/trainer/ppo/reward.py``
``load_reward_manager`` -> ``get_custom_reward_fn``, and the reward loop's ``RewardManager``), so the
symbolic workers are started here: they import sympy and warm up while the first rollouts are
generated, and no reward waits for a cold start.
"""

from retool.recipe.reward.score import compute_score
from retool.recipe.reward.symbolic import warm_default_pool

warm_default_pool()

__all__ = ["compute_score"]
