"""One token sequence on the 0.9 line: what RL trains on is what SFT trained on and what evaluation asks.

The invariant of tests/turns/test_token_parity.py (the 0.6 line), on verl 0.9.1's own runtime: for the
same multi-turn conversations with interpreter calls, run through our 0.9 agent loop (verl 0.9.1's
``ToolAgentLoop``, whose Continuous Token builder renders every turn with the chat template,
``verl/utils/tokenizer/continuous_token_wiring.py``) against the real sandbox, with real Qwen2.5 and
Qwen3 tokenizers, the prompt + response ids equal, id for id:

- ``apply_chat_template`` of the same messages (plus the template's newline after the final
  ``<|im_end|>``, which the model stops before);
- what the dataset verl 0.9.1's sft trainer builds tokenizes for those messages written as our SFT rows,
  with the data settings the 0.9 sft stage renders (``sft_trainer_engine``, ``data.custom_cls``: our
  :mod:`retool.recipe.verl_plugins.v0_9.sft_dataset`; verl's own ``MultiTurnSFTDataset`` drops Qwen3's
  reasoning and fails its own check here);
- what ``retool eval`` sends at every turn (the evaluation is the same on both lines).

verl 0.9.0 fixed the missing newline between an assistant turn and a tool turn (verl PRs #6921,
#6804) that the 0.6 line's agent loop puts back itself; this is where that fix is held to account
for our tool and both tokenizers. A mismatch names the first differing position and both decoded
neighbourhoods (:func:`retool.recipe.turns.token_mismatch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from retool.data.schema import SFT_SCHEMA, code_interpreter_tool
from retool.recipe.render.command import hydra_overrides
from retool.recipe.turns import missing_turn_end, token_mismatch, turn_end_ids
from tests.preflight.conftest import sandbox  # noqa: F401  (session fixture)
from tests.render.verl_config import compose_verl
from tests.turns.scenarios import PROMPT, SCENARIOS, conversation, eval_mismatch, rendered, thinking
from tests.verl09.lines import rendered as rendered_stage
from tests.verl09.loop import run_loop

pytestmark = pytest.mark.slow

def sft_ids(model: str, tokenizer: Any, messages: list[dict[str, Any]], path: Path) -> list[int]:
    """The dataset verl 0.9.1's sft trainer builds (``create_sft_dataset``: the rendered ``data.custom_cls``)
    on the conversation as one of our SFT rows, with the sft stage's data settings."""
    from verl.trainer.sft_trainer import create_sft_dataset

    command = rendered_stage("smoke-qwen0.5b", "sft")
    config = compose_verl(command.config_name, hydra_overrides({**command.overrides, "model.path": model, "data.max_length": 8192, "data.truncation": "error"}))
    pq.write_table(pa.Table.from_pylist([{"messages": messages, "tools": [code_interpreter_tool()], "data_source": "parity"}], schema=SFT_SCHEMA), path)
    item = create_sft_dataset(str(path), config.data, tokenizer, None)[0]
    ids = item["input_ids"]
    if "attention_mask" in item:
        ids = ids[item["attention_mask"].bool()]
    return [int(t) for t in ids.tolist()]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rl_sft_and_eval_see_one_token_sequence_on_verl_091(scenario: str, model_dir: str, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    turns = thinking(SCENARIOS[scenario]) if "<think>" in tokenizer.get_added_vocab() else SCENARIOS[scenario]
    replies = [turn.generated() + tokenizer.eos_token for turn in turns]
    output, llm, _, data = run_loop(model_dir, sandbox, tmp_path, replies, prompt=PROMPT)
    assert len(llm.prompts) == len(turns), "the loop ran every scripted turn"
    tool_messages = [m for m in data.messages if m["role"] == "tool"]
    messages = conversation(turns, [{"content": m["content"]} for m in tool_messages])
    tools = [code_interpreter_tool()]

    # The loop's ids, closed as the template closes the last turn, are the template's.
    template = rendered(tokenizer, messages, tools)
    ids = list(output.prompt_ids) + list(output.response_ids)
    loop_ids = ids + missing_turn_end(ids, turn_end_ids(tokenizer))
    assert (problem := token_mismatch(template, loop_ids, tokenizer, expected_name="apply_chat_template", actual_name="verl 0.9.1 agent loop")) is None, problem
    # Only what the model generated is trained on.
    assert sum(output.response_mask) == sum(len(tokenizer.encode(r, add_special_tokens=False)) for r in replies)

    # The SFT data tokenizes to the same ids on this line's dataset.
    sft = sft_ids(model_dir, tokenizer, messages, tmp_path / "sft.parquet")
    assert (problem := token_mismatch(template, sft, tokenizer, expected_name="apply_chat_template", actual_name="the 0.9 sft dataset")) is None, problem

    # retool eval asks the model, turn by turn, what the agent loop asked it.
    assert (problem := eval_mismatch(tokenizer, sandbox, turns, llm.prompts, template)) is None, problem
