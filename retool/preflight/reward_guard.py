"""The reward guard: the function verl actually calls in a composed config must be ours, on every line.

Why it exists: verl 0.9.1 reads the reward from ``reward.custom_reward_function``, while 0.6.1 read
the top-level ``custom_reward_function``; 0.9.1 still composes the top-level keys (its
``legacy_reward_impl`` config) but only ``fully_async_main`` migrates them (``main_ppo`` does not;
upstream PR #7331 closed unmerged). Rendered the 0.6 way, a 0.9.1 run would train on verl's default
scorer, with no error. So the guard asks verl itself: it builds the reward manager with verl's own
``load_reward_manager`` on the composed config - the call verl's reward workers make (0.6.1's
``RewardManagerWorker`` and trainer, 0.9.1's ``RewardLoopWorker``) - and unwraps the manager's
``compute_score`` down to the raw function. It passes only when that function is
:func:`retool.recipe.reward.score.compute_score` and the keyword arguments verl binds to it are the
rendered ones (``tool_turn_shaping`` on the rl stage). There is no switch to turn it off: the
preflight runs it on every PPO stage, and ``tests/render`` and ``tests/verl09`` run it on every
example on both lines.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from retool.preflight.checks import CheckResult
from retool.recipe.reward import score

CHECK = "reward-guard"
WRAPPERS = ("_call_with_kwargs", "_call_with_kwargs_async")
"""verl's partials that bind ``reward_kwargs`` to the loaded function (``verl.trainer.ppo.reward``, 0.6.1 and 0.9.1)."""


def ours() -> Any:
    return score.compute_score


def describe(function: Any) -> str:
    module = getattr(function, "__module__", None) or type(function).__module__
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}.{name}"


def unwrap(function: Any) -> tuple[Any, dict[str, Any]]:
    """(the raw function under verl's partials and decorators, the keyword arguments they bind)."""
    bound: dict[str, Any] = {}
    for _ in range(32):
        if isinstance(function, functools.partial):
            if getattr(function.func, "__name__", "") in WRAPPERS and function.args:
                if len(function.args) > 1 and isinstance(function.args[1], Mapping):
                    bound.update(function.args[1])
                function = function.args[0]
            else:
                bound.update(function.keywords)
                function = function.func
        elif hasattr(function, "__wrapped__"):
            function = function.__wrapped__
        else:
            break
    return function, bound


def called_reward(config: Any) -> tuple[Any, dict[str, Any]]:
    """The raw reward function (and its bound keyword arguments) verl's reward manager calls for ``config``."""
    from verl.trainer.ppo.reward import load_reward_manager

    # Each verl process loads the file once; a fresh module stands for a fresh process.
    for name in [n for n in sys.modules if n.startswith("custom_module")]:
        sys.modules.pop(name, None)
    extra = {"num_examine": 0} if "num_examine" in inspect.signature(load_reward_manager).parameters else {}
    manager = load_reward_manager(config, None, **extra)
    return unwrap(manager.compute_score)


def check_reward_guard(config: Any, scope: str, expected_kwargs: Mapping[str, Any]) -> CheckResult:
    """``reward-guard`` on one composed PPO config: passed only when verl would call our reward with ``expected_kwargs``."""
    try:
        function, bound = called_reward(config)
    except Exception as exc:
        return CheckResult(CHECK, scope, "failed", f"verl could not build its reward manager from the composed config: {type(exc).__name__}: {exc}")
    details = {"called": describe(function), "expected": describe(ours()), "reward_kwargs": dict(bound)}
    if function is not ours():
        return CheckResult(
            CHECK,
            scope,
            "failed",
            f"verl would score with {describe(function)}, not ours ({describe(ours())}): the reward keys do not reach this verl "
            "(verl 0.9 reads reward.custom_reward_function.*, 0.6 the top-level custom_reward_function.*)",
            details,
        )
    if dict(bound) != dict(expected_kwargs):
        return CheckResult(CHECK, scope, "failed", f"verl binds reward_kwargs {dict(bound)} to our reward, the run renders {dict(expected_kwargs)}", details)
    return CheckResult(CHECK, scope, "passed", f"verl calls {describe(function)}" + (f" with {dict(bound)}" if bound else ""), details)


def expected_reward_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The reward keyword arguments a rendered PPO command sets (either line's key prefix)."""
    out = {}
    for key, value in overrides.items():
        for prefix in ("+custom_reward_function.reward_kwargs.", "+reward.custom_reward_function.reward_kwargs."):
            if key.startswith(prefix):
                out[key.removeprefix(prefix)] = value
    return out
