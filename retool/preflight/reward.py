"""The reward function as verl loads it (``get_custom_reward_fn``), and the shape of what it returns.

In async agent-loop mode verl's reward loop turns every key of a dict result into a column of the
rollout output (``np.array([...])`` per key) and ``RayPPOTrainer`` joins that output to its batch
with ``DataProto.union``, which asserts that a key both sides hold is equal, dtype included. So a
result key that repeats a batch column (``data_source``) crashes validation and training; a value
whose type changes between samples changes the column's dtype; numpy booleans break the eval
stage's validation dump (``json.dumps``). All of it is visible from two calls: a right and a wrong
answer to one prompt of each data source.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from omegaconf import DictConfig
from verl.trainer.ppo.reward import get_custom_reward_fn

from retool.preflight.checks import CheckResult
from retool.preflight.data import Prompt

AGENT_LOOP_COLUMNS = ("__num_turns__", "turn_scores", "tool_rewards", "reward_extra_info", "multi_modal_inputs", "uid")
"""Non-tensor columns verl's agent loop output and trainer add beside the dataset's own (verl 0.6.1)."""

WRONG_ANSWER = "preflight-not-the-answer"
VERL_REWARD_MODULE = "custom_module"


P = ParamSpec("P")
R = TypeVar("R")


def forget_loaded_reward() -> None:
    """Make verl's next ``get_custom_reward_fn`` load the configured file again.

    verl loads the reward file once per process under the module name ``custom_module`` and reuses
    that module for any later path. Each verl process (trainer, reward worker) loads its run's
    file; a preflight checking several configs in one process stands for such fresh processes.
    """
    sys.modules.pop(VERL_REWARD_MODULE, None)


def leaves_no_reward_loaded(run: Callable[P, R]) -> Callable[P, R]:
    """A preflight that leaves the process as it found it: without its reward module in ``sys.modules``.

    The preflight loads each stage's reward file (and a user's may be broken on purpose, as the
    preflight's tests do); whatever verl loads next in the same process (a trainer in a test, a second
    preflight) must load its own file, not inherit the last one checked."""

    @functools.wraps(run)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return run(*args, **kwargs)
        finally:
            forget_loaded_reward()

    return wrapper


def score_of(result: Any) -> float:
    return float(result["score"] if isinstance(result, Mapping) else result)


def shape_problems(results: Sequence[Any], columns: Iterable[str]) -> tuple[list[str], list[str]]:
    """(collisions and type changes, boolean keys) of dict results; empty lists for plain scores."""
    dicts = [r for r in results if isinstance(r, Mapping)]
    if not dicts:
        return [], []
    problems = []
    taken = set(columns)
    for key in sorted(set().union(*dicts) & taken):
        problems.append(f"result key {key!r} repeats the batch column {key!r}: DataProto.union asserts on it in validation and training")
    keys = [tuple(sorted(d)) for d in dicts]
    if len(set(keys)) > 1:
        problems.append(f"results have different keys across samples: {sorted(set(keys))}")
    for key in sorted(set().union(*dicts)):
        types = sorted({type(d[key]).__name__ for d in dicts if key in d})
        if len(types) > 1:
            problems.append(f"result key {key!r} changes type across samples ({', '.join(types)}): the column's dtype would depend on the batch")
    booleans = sorted({key for d in dicts for key, value in d.items() if isinstance(value, bool)})
    return problems, booleans


def check_reward(config: DictConfig, scope: str, prompts: Sequence[Prompt], columns: Iterable[str], *, dumps_validation: bool) -> tuple[CheckResult, float | None]:
    """``reward``: verl loads the function; per data source a right answer outscores a wrong one; the result fits the batch.

    Returns the result and the score of a right answer (what every scripted rollout must earn), also
    when the result's shape fails: the rollout then shows what the trainer does with such results.
    """
    forget_loaded_reward()
    try:
        function = get_custom_reward_fn(config)
    except Exception as exc:
        return CheckResult("reward", scope, "failed", f"verl could not load custom_reward_function {dict(config.custom_reward_function)}: {type(exc).__name__}: {exc}"), None
    if function is None:
        summary = "custom_reward_function.path is not set: verl would fall back to its default scorers, which do not know these data sources"
        return CheckResult("reward", scope, "failed", summary), None
    results: list[Any] = []
    scores: dict[str, tuple[float, float]] = {}
    try:
        for prompt in prompts:
            right = function(data_source=prompt.data_source, solution_str=f"So the answer is \\boxed{{{prompt.ground_truth}}}.", ground_truth=prompt.ground_truth, extra_info={})
            wrong = function(data_source=prompt.data_source, solution_str=f"So the answer is \\boxed{{{WRONG_ANSWER}}}.", ground_truth=prompt.ground_truth, extra_info={})
            results += [copy.deepcopy(right), copy.deepcopy(wrong)]
            scores[prompt.data_source] = (score_of(right), score_of(wrong))
    except Exception as exc:
        return CheckResult("reward", scope, "failed", f"the reward function raised {type(exc).__name__}: {exc}"), None
    details: dict[str, Any] = {"function": f"{config.custom_reward_function.path}:{config.custom_reward_function.name}", "scores": {k: list(v) for k, v in scores.items()}}
    if results and isinstance(results[0], Mapping):
        details["result_keys"] = sorted(results[0])
    not_separated = [source for source, (right, wrong) in scores.items() if not right > wrong]
    if not_separated:
        return CheckResult("reward", scope, "failed", f"a right answer does not outscore a wrong one for {', '.join(not_separated)}", details), None
    right_score = min(right for right, _ in scores.values())
    problems, booleans = shape_problems(results, columns)
    if booleans and dumps_validation:
        problems.append(f"result key(s) {', '.join(booleans)} hold booleans: verl's validation dump (json.dumps of numpy booleans) fails in the eval stage")
    if problems:
        details["problems"] = problems
        return CheckResult("reward", scope, "failed", problems[0], details), right_score
    summary = ", ".join(f"{source}: right {right:g}, wrong {wrong:g}" for source, (right, wrong) in scores.items())
    if booleans:
        return CheckResult("reward", scope, "warning", f"{summary}; boolean result key(s) {', '.join(booleans)} would break a validation dump", details), right_score
    return CheckResult("reward", scope, "passed", summary, details), right_score
