"""verl 0.6.1 line: the tool-use dynamics of real agent-loop rollouts equal the paper's definitions computed by hand.

Every scenario of the parity tests runs through our agent loop (verl 0.6.1's ``ToolAgentLoop`` with the
real sandbox tool) with real Qwen2.5 and Qwen3 tokenizers; the records the loop leaves go through the
trainer's reduction (:func:`retool.recipe.dynamics.reduce_dynamics`, with the lengths the trainer
reads from them), and ``tool/first_call_position_mean`` and the code-line metrics must equal what
:mod:`tests.turns.by_hand` computes from the decoded token ids. The scenarios put text before a call
(the turn-end position differs from the call's start) and a fenced code block (fence lines are not code),
so the old definitions fail here. The 0.9 line runs the same check (tests/verl09/test_dynamics_by_hand.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retool.recipe.dynamics import reduce_dynamics
from tests.preflight.conftest import sandbox  # noqa: F401  (session fixture)
from tests.turns.by_hand import expected_metrics
from tests.turns.harness import ScriptedModel, loop_config, run_agent_loop, write_tool_config
from tests.turns.scenarios import PROMPT, SCENARIOS, thinking

pytestmark = pytest.mark.slow


@pytest.fixture(params=["qwen25", "qwen3"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    from verl.utils import hf_tokenizer

    return hf_tokenizer(request.getfixturevalue("qwen25_tokenizer" if request.param == "qwen25" else "qwen_tokenizer"))


def test_first_call_position_and_code_lines_equal_hand_computation(tokenizer: Any, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    config = loop_config(write_tool_config(tmp_path / "tools.yaml", sandbox))
    records, rollouts = [], []
    for turns in SCENARIOS.values():
        turns = thinking(turns) if "<think>" in tokenizer.get_added_vocab() else turns
        rollout = run_agent_loop(tokenizer, config, ScriptedModel(tokenizer, turns), PROMPT)
        records.append(rollout.record)
        rollouts.append((list(rollout.output.response_ids), list(rollout.output.response_mask)))
    metrics = reduce_dynamics(records, [True] * len(records), [r["response_tokens"] for r in records])
    expected = expected_metrics(rollouts, tokenizer)
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
