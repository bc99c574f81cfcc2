"""Our agent loop and tool on verl 0.9.1's own runtime, on CPU: a real Qwen3 tokenizer, a scripted LLM server, a scripted sandbox.

What verl 0.9.1 does in an ``AgentLoopWorker`` for one sample, done here with its own pieces: the
tools come from verl's registry (``load_all_tools``) reading the rendered tool config; the loop class
comes from the rendered ``agent_loop_config_path`` (our YAML), instantiated with hydra as verl does,
given the tools through the constructor (``ToolListWrap``); the LLM server is scripted (a model's
tokens, ending in ``<|im_end|>``), so the test sees exactly which tokens the model produced.

Checked: the call reaches the sandbox through our tool, the dynamics record is there, and the
turn-format invariant - the trajectory's tokens are exactly what the chat template renders for the
same conversation, and the loss mask covers exactly the model's tokens (never the tool's output).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retool.recipe.dynamics import RECORD_KEY
from retool.recipe.tool.config import code_interpreter_tool
from tests.recipe_tool.scripted_server import Script, scripted_sandbox
from tests.verl09.loop import PROBLEM, run_loop

CODE = "x = 6 * 7\nprint(x)"
CALL_TURN = 'I will compute it.\n<tool_call>\n{"name": "code_interpreter", "arguments": ' + json.dumps({"code": CODE}) + "}\n</tool_call><|im_end|>"
ANSWER_TURN = "The product is \\boxed{42}.<|im_end|>"


@pytest.fixture
def sandbox() -> Any:
    script = Script()
    with scripted_sandbox(script) as url:
        yield script, url


def test_a_tool_call_runs_in_the_sandbox_and_is_recorded(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    script, url = sandbox
    output, llm, _, _ = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN])
    assert [r["code"] for r in script.requests] == [CODE]
    assert len(llm.prompts) == 2, "the loop asks the model again after the tool answered"
    record = output.extra_fields[RECORD_KEY]
    assert record["outcomes"] == ["ok"] and record["hit_max_turns"] is False
    assert record["response_tokens"] == len(output.response_ids)


def test_the_turn_format_is_the_chat_templates_and_only_the_models_tokens_are_trained(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    _, url = sandbox
    output, llm, tokenizer, _ = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN])
    ids = list(output.prompt_ids) + list(output.response_ids)
    mask = list(output.response_mask)
    assert len(mask) == len(output.response_ids)
    trained = [t for t, m in zip(output.response_ids, mask, strict=True) if m]
    model_tokens = tokenizer.encode(CALL_TURN, add_special_tokens=False) + tokenizer.encode(ANSWER_TURN, add_special_tokens=False)
    assert trained == model_tokens, "the loss mask covers exactly the tokens the model generated"
    untrained = tokenizer.decode([t for t, m in zip(output.response_ids, mask, strict=True) if not m])
    assert "ran " in untrained and "<tool_response>" in untrained, "the tool's output is in the context, masked out"
    # The second request's prompt is the first prompt + the model's turn + the tool turn, token for token.
    assert llm.prompts[1] == ids[: len(llm.prompts[1])]
    # Each prompt the model is given is the chat template's rendering of the conversation so far,
    # with the generation prompt: the model is trained in the format it is served in.
    tool_text = untrained.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
    call = {"role": "assistant", "content": "I will compute it.", "tool_calls": [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": CODE}}}]}
    tools = [code_interpreter_tool()]
    for prompt, conversation in zip(llm.prompts, ([*PROBLEM], [*PROBLEM, call, {"role": "tool", "content": tool_text}]), strict=True):
        templated = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(prompt) == templated
        assert prompt == tokenizer.encode(templated, add_special_tokens=False)


def test_a_call_verl_cannot_hand_to_the_tool_is_recorded_as_malformed(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    script, url = sandbox
    bad = 'Try.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call><|im_end|>'
    output, _, _, _ = run_loop(qwen_model, url, tmp_path, [bad, ANSWER_TURN])
    assert script.requests == []
    assert output.extra_fields[RECORD_KEY]["outcomes"] == ["malformed"]


def test_max_turns_is_recorded(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    _, url = sandbox
    output, llm, _, _ = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN], max_turns=1)
    assert len(llm.prompts) == 1
    assert output.extra_fields[RECORD_KEY]["hit_max_turns"] is True
