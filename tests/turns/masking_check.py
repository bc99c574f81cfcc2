"""A training step over real agent-loop rollouts, some failed by a sandbox that went down mid-step: both lines' check.

The rollouts come from each line's own agent loop against our real sandbox, which the test stops
half-way through the step (tests/turns/test_sandbox_failure_mask.py for verl 0.6.1,
tests/verl09/test_sandbox_failure_mask.py for 0.9.1). :func:`scored_batch` lays them out as verl's
``AgentLoopWorker._postprocess`` does (left-padded prompts, right-padded responses, ``response_mask``,
the extra fields as object columns, the reward at the last response token) with the group ids ``fit``
gives; the trainer's probe masks it; then verl's own ``compute_advantage`` and policy loss run on it,
and :func:`assert_trains_only_on_the_rest` checks what they did against GRPO computed by hand.

The step has three groups of the same problem, answered with ``<tool_call>`` turns by a scripted model:
``a`` (3 rollouts: right, wrong, and one whose call hit the stopped sandbox), ``b`` (2: right, and one
hit) and ``c`` (2 without calls: right, wrong). Left out: the two hit ones and ``b``'s lone survivor.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from retool.recipe.dynamics import RECORD_KEY
from retool.recipe.reward.score import compute_score

TRUTH = "42"
CODE = "print(6 * 7)"
CALL = "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": CODE}}) + "\n</tool_call>"
RIGHT, WRONG = "So the answer is \\boxed{42}.", "So the answer is \\boxed{41}."

# (group, the assistant turns, whether the sandbox is up for it); the order the step runs them in.
PLAN: list[tuple[str, list[str], bool]] = [
    ("a", ["Let me compute.\n" + CALL, RIGHT], True),
    ("a", ["Let me compute.\n" + CALL, WRONG], True),
    ("b", [CALL, RIGHT], True),
    ("c", [RIGHT], True),
    ("c", [WRONG], True),
    ("a", ["Let me compute.\n" + CALL, WRONG], False),
    ("b", [CALL, WRONG], False),
]
MASKED = [False, False, True, False, False, True, True]
"""The hit rows (5, 6) and group b's lone survivor (2)."""


def scored_batch(rollouts: Sequence[Any], groups: Sequence[str], tokenizer: Any, data_proto: Any) -> tuple[Any, torch.Tensor]:
    """(the step's ``DataProto``, each row's reward) from agent-loop outputs, laid out as verl lays them out."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompt_len = max(len(r.prompt_ids) for r in rollouts)
    response_len = max(len(r.response_ids) for r in rollouts)
    n = len(rollouts)
    prompts = torch.full((n, prompt_len), pad)
    responses = torch.full((n, response_len), pad)
    response_mask = torch.zeros((n, response_len), dtype=torch.long)
    attention = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    scores = torch.zeros((n, response_len))
    rewards = []
    for i, r in enumerate(rollouts):
        p, ids = list(r.prompt_ids), list(r.response_ids)
        prompts[i, prompt_len - len(p) :] = torch.tensor(p)
        responses[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = torch.tensor(list(r.response_mask))
        attention[i, prompt_len - len(p) : prompt_len + len(ids)] = 1
        reward = compute_score("aime_2024", tokenizer.decode(ids, skip_special_tokens=True), TRUTH)["score"]
        scores[i, len(ids) - 1] = reward
        rewards.append(reward)
    records = np.empty(n, dtype=object)
    records[:] = [r.extra_fields[RECORD_KEY] for r in rollouts]
    data = data_proto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": response_mask, "attention_mask": attention, "rm_scores": scores},
        non_tensors={RECORD_KEY: records, "uid": np.array(list(groups), dtype=object)},
        meta_info={"reward_extra_keys": []},
    )
    return data, torch.tensor(rewards)


def hand_grpo(rewards: torch.Tensor, groups: Sequence[str], kept: Sequence[bool], epsilon: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage of each kept row over its group's kept rows (sample std, as ``torch.std``); 0 elsewhere."""
    out = torch.zeros(len(groups))
    for g in set(groups):
        rows = [i for i, (h, k) in enumerate(zip(groups, kept, strict=True)) if h == g and k]
        if len(rows) >= 2:
            values = rewards[rows]
            out[rows] = (values - values.mean()) / (values.std() + epsilon)
    return out


def assert_trains_only_on_the_rest(data: Any, rewards: torch.Tensor, groups: Sequence[str], compute_advantage: Callable[[Any], Any], policy_loss: Callable[..., Any]) -> None:
    """verl's advantages over the masked batch are GRPO over the kept rows, and its loss has no gradient on the left-out ones."""
    masked = torch.tensor(MASKED)
    original_mask = data.batch["response_mask"].clone()
    assert (data.batch["response_mask"][masked] == 0).all(), "a left-out row has no token in the loss"
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data)
    advantages, mask = data.batch["advantages"], data.batch["response_mask"]
    expected = hand_grpo(rewards, groups, [not m for m in MASKED])
    for row in np.flatnonzero(~masked.numpy()):
        tokens = mask[row].bool()
        assert tokens.any()
        assert torch.allclose(advantages[row][tokens], expected[row].expand(int(tokens.sum())), atol=1e-5), (row, advantages[row][tokens][:3], expected[row])
    assert expected[~masked].abs().sum() > 0, "the kept groups carry a signal"

    old_log_prob = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(0))
    log_prob = (old_log_prob + 0.01).requires_grad_()
    loss = policy_loss(old_log_prob, log_prob, advantages, mask)
    loss.backward()
    grad = log_prob.grad
    assert (grad[masked] == 0).all(), "no gradient from a left-out row"
    kept_signal = ~masked & (expected != 0)
    assert all((grad[row][original_mask[row].bool()] != 0).all() for row in np.flatnonzero(kept_signal.numpy())), "every token of a kept row with an advantage has a gradient"


def assert_masked_share_logged(client: Any, run_id: str, *, steps: Sequence[int]) -> None:
    """MLflow has the step's masking figures at each of ``steps`` (the refused step's too): 2 hit, 1 lone survivor, 3 of 7."""
    names = ("tool/masked_ratio", "tool/masked_sandbox_failure_count", "tool/masked_orphaned_count")
    logged = {name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)] for name in names}
    expected = {"tool/masked_ratio": 3 / 7, "tool/masked_sandbox_failure_count": 2.0, "tool/masked_orphaned_count": 1.0}
    assert logged == {name: [(step, pytest.approx(value)) for step in steps] for name, value in expected.items()}


def assert_the_sandbox_failed_the_last_two(outputs: Sequence[Any]) -> list[str]:
    """The calls made while the sandbox was up ran, the two after it stopped did not; returns the rows' group ids."""
    outcomes = [o.extra_fields[RECORD_KEY]["outcomes"] for o in outputs]
    assert outcomes == [["ok"], ["ok"], ["ok"], [], [], ["unavailable"], ["unavailable"]]
    return [g for g, _, _ in PLAN]


@contextlib.contextmanager
def mlflow_run(tmp_path: Any, monkeypatch: Any) -> Iterator[tuple[Any, str]]:
    """An MLflow run (sqlite) that the trainer's watcher writes to, named as the stage's environment names it.

    The watcher takes the process's active run and tracking URI first (``MlflowTarget.current``), and
    another test of the same worker process may have left both set (and its store gone): so this
    run's URI is the process's for the test, and no fluent run counts as active (``MLFLOW_RUN_ID``
    names the run, as in a stage whose logger has not started one on this thread).
    """
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("masking")).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.setattr(mlflow, "active_run", lambda: None)
    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield client, run_id
    finally:
        mlflow.set_tracking_uri(previous_uri)
