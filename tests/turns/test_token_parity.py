"""One token sequence: what RL trains on is what SFT trained on and what evaluation asks.

For multi-turn conversations with interpreter calls, run through our agent loop (verl 0.6.1's
``ToolAgentLoop`` with the real sandbox tool) with real Qwen2.5 and Qwen3 tokenizers, the prompt +
response ids the loop builds must equal, id for id:

- ``apply_chat_template`` of the same messages (plus the end of the last turn, which the model stops
  before: the template's newline after the final ``<|im_end|>``);
- what verl's ``MultiTurnSFTDataset`` tokenizes for those messages written as our SFT rows;
- what ``retool eval`` sends: its conversation loop against the same model behind a vLLM-like
  endpoint, every request rendered as vLLM renders it, equals the prompt the agent loop sent at
  that turn, and the finished conversation equals the whole sequence.

A mismatch names the first differing position and both decoded neighbourhoods
(:func:`retool.recipe.turns.token_mismatch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retool.data.schema import SFT_SCHEMA, code_interpreter_tool
from retool.recipe.dynamics import code_lines
from retool.recipe.turns import missing_turn_end, token_mismatch, turn_end_ids
from tests.preflight.conftest import sandbox  # noqa: F401  (session fixture)
from tests.turns.harness import ScriptedModel, loop_config, run_agent_loop, write_tool_config
from tests.turns.scenarios import PROMPT, SCENARIOS, conversation, eval_mismatch, rendered, thinking

pytestmark = pytest.mark.slow

@pytest.fixture(params=["qwen25", "qwen3"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    from verl.utils import hf_tokenizer

    return hf_tokenizer(request.getfixturevalue("qwen25_tokenizer" if request.param == "qwen25" else "qwen_tokenizer"))


def sft_ids(tokenizer: Any, messages: list[dict[str, Any]], path: Path) -> list[int]:
    """verl's MultiTurnSFTDataset on the conversation written as one of our SFT rows."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    pq.write_table(pa.Table.from_pylist([{"messages": messages, "tools": [code_interpreter_tool()], "data_source": "parity"}], schema=SFT_SCHEMA), path)
    item = MultiTurnSFTDataset(str(path), tokenizer, config={"max_length": 8192, "truncation": "error"})[0]
    return item["input_ids"][item["attention_mask"].bool()].tolist()


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rl_sft_and_eval_see_one_token_sequence(scenario: str, tokenizer: Any, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    turns = thinking(SCENARIOS[scenario]) if "<think>" in tokenizer.get_added_vocab() else SCENARIOS[scenario]
    model = ScriptedModel(tokenizer, turns)
    rollout = run_agent_loop(tokenizer, loop_config(write_tool_config(tmp_path / "tools.yaml", sandbox)), model, PROMPT)
    assert len(model.prompts) == len(turns), "the loop ran every scripted turn"
    messages = conversation(turns, rollout.tool_messages)

    # The loop's ids, closed as the template closes the last turn, are the template's.
    template = rendered(tokenizer, messages, rollout.tool_schemas)
    loop_ids = rollout.ids + missing_turn_end(rollout.ids, turn_end_ids(tokenizer))
    assert (problem := token_mismatch(template, loop_ids, tokenizer, expected_name="apply_chat_template", actual_name="agent loop")) is None, problem
    # Only what the model generated is trained on: the separators and tool turns are masked out.
    assert sum(rollout.output.response_mask) == sum(len(model.reply_ids(i)) for i in range(len(turns)))

    # The SFT data (our row layout and tool schema) tokenizes to the same ids.
    sft = sft_ids(tokenizer, messages, tmp_path / "sft.parquet")
    assert (problem := token_mismatch(template, sft, tokenizer, expected_name="apply_chat_template", actual_name="MultiTurnSFTDataset")) is None, problem

    # retool eval asks the model, turn by turn, what the agent loop asked it.
    assert (problem := eval_mismatch(tokenizer, sandbox, turns, model.prompts, template)) is None, problem


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_first_call_position_is_where_the_call_begins(scenario: str, qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    """Positions known by construction: the first call's ``<tool_call>`` token follows the tokens of the text before it and its newline."""
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(qwen_tokenizer)
    turns = SCENARIOS[scenario]
    model = ScriptedModel(tokenizer, turns)
    rollout = run_agent_loop(tokenizer, loop_config(write_tool_config(tmp_path / "tools.yaml", sandbox)), model, PROMPT)
    first = turns[0]
    before = len(tokenizer.encode(first.text + "\n", add_special_tokens=False)) if first.text else 0
    assert model.reply_ids(0)[before] == tokenizer.convert_tokens_to_ids("<tool_call>")
    assert rollout.record["first_call_at"] == before
    assert rollout.record["response_tokens"] == len(rollout.output.response_ids)
    assert rollout.record["code_lines"] == [code_lines(t.code) for t in turns if t.code is not None]


def test_a_template_without_a_readable_turn_end_keeps_verls_sequence(qwen_tokenizer: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A template that rewrites assistant content gives no end of turn to put back: the loop warns and appends as verl does."""
    from omegaconf import open_dict
    from verl.utils import hf_tokenizer

    from retool.recipe.verl_plugins.agent_loop import RetoolToolAgentLoop

    tokenizer = hf_tokenizer(qwen_tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
    config = loop_config(tmp_path / "unused.yaml")
    with open_dict(config):
        config.actor_rollout_ref.rollout.multi_turn.tool_config_path = None
    RetoolToolAgentLoop._class_initialized = False
    try:
        RetoolToolAgentLoop.init_class(config, tokenizer, None)
        assert RetoolToolAgentLoop.turn_end == []
    finally:
        RetoolToolAgentLoop._class_initialized = False
    assert "does not render an assistant message's content verbatim" in caplog.text


def test_the_separator_counts_against_the_response_budget_as_verl_counts_a_tool_turn(qwen_tokenizer: str, sandbox: str, tmp_path: Path) -> None:  # noqa: F811
    """verl ends the rollout when a tool turn would reach ``response_length``; with the separator counted,
    a budget one token short of first turn + separator + tool turn ends it there, one more lets it go on."""
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(qwen_tokenizer)
    turns = SCENARIOS["a call at token 0"]
    tools = write_tool_config(tmp_path / "tools.yaml", sandbox)
    model = ScriptedModel(tokenizer, turns)
    full = run_agent_loop(tokenizer, loop_config(tools), model, PROMPT)
    first = len(model.reply_ids(0))
    mask = list(full.output.response_mask)
    tool_turn = mask.index(1, first) - first  # separator + tool turn, all masked out
    assert mask[:first] == [1] * first and tool_turn > 1

    short = ScriptedModel(tokenizer, turns)
    ended = run_agent_loop(tokenizer, loop_config(tools, response_length=first + tool_turn), short, PROMPT)
    assert len(short.prompts) == 1, "the tool turn with its separator reaches response_length: the rollout ends after the first turn"
    assert list(ended.output.response_ids) == model.reply_ids(0) and list(ended.output.response_mask) == [1] * first

    enough = ScriptedModel(tokenizer, turns)
    went_on = run_agent_loop(tokenizer, loop_config(tools, response_length=first + tool_turn + 1), enough, PROMPT)
    assert len(enough.prompts) == 2 and list(went_on.output.response_mask[: first + tool_turn]) == mask[: first + tool_turn]


def test_verl_061_sft_dataset_cuts_a_qwen3_tool_turn_after_a_turn_without_reasoning(qwen_tokenizer: str, tmp_path: Path) -> None:
    """The limit docs/recipe.md describes, pinned as verl 0.6.1 behaves: with Qwen3's template and a
    reasoning-free assistant turn (the ReTool SFT layout), MultiTurnSFTDataset trains the turn with an
    empty think block and cuts as many characters from the start of the tool turn after it. When a verl
    upgrade fixes this, this test fails: turn the Qwen3 scenarios of the parity test to reasoning-free turns."""
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(qwen_tokenizer)
    turns = SCENARIOS["a call at token 0"]
    messages = conversation(turns, [{"role": "tool", "content": "42"}])
    text = tokenizer.decode(sft_ids(tokenizer, messages, tmp_path / "sft.parquet"))
    empty_think = "<think>\n\n</think>\n\n"
    assert f"<|im_start|>assistant\n{empty_think}<tool_call>" in text
    assert "</tool_call><|im_end|>\n" + "<|im_start|>user\n<tool_response>\n42"[len(empty_think) :] in text
    assert "<|im_start|>user\n<tool_response>" not in text
