"""verl 0.9.1 line: the tool-use dynamics of real agent-loop rollouts equal the paper's definitions computed by hand.

The 0.6 line's check (tests/turns/test_dynamics_by_hand.py) on verl 0.9.1's own runtime: every parity
scenario runs through our 0.9 agent loop (verl 0.9.1's ``ToolAgentLoop``, its Continuous Token builder
and the real sandbox) with real Qwen2.5 and Qwen3 tokenizers; the trainer's reduction of the loop's
records must give the ``tool/first_call_position_mean`` and code-line metrics that
:mod:`tests.turns.by_hand` computes from the decoded token ids. The old 0.9 definition (where the first
call's turn *ends*) and counting a code block's fence lines both fail here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from retool.recipe.dynamics import RECORD_KEY, reduce_dynamics
from tests.preflight.conftest import sandbox  # noqa: F401  (session fixture)
from tests.turns.by_hand import expected_metrics
from tests.turns.scenarios import PROMPT, SCENARIOS, thinking
from tests.verl09.loop import run_loop

pytestmark = pytest.mark.slow


def test_first_call_position_and_code_lines_equal_hand_computation_on_verl_091(model_dir: str, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records, rollouts = [], []
    for i, turns in enumerate(SCENARIOS.values()):
        turns = thinking(turns) if "<think>" in tokenizer.get_added_vocab() else turns
        replies = [turn.generated() + tokenizer.eos_token for turn in turns]
        work = tmp_path / str(i)
        work.mkdir()
        output, _, _, _ = run_loop(model_dir, sandbox, work, replies, prompt=PROMPT)
        records.append(output.extra_fields[RECORD_KEY])
        rollouts.append((list(output.response_ids), list(output.response_mask)))
    metrics = reduce_dynamics(records, [True] * len(records), [r["response_tokens"] for r in records])
    expected = expected_metrics(rollouts, tokenizer)
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
