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

import asyncio
import json
from pathlib import Path
from typing import Any

import hydra
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from retool.recipe.dynamics import RECORD_KEY
from retool.recipe.render.command import hydra_overrides
from retool.recipe.tool.config import code_interpreter_tool, tool_config_yaml
from retool.recipe.verl_plugins import v0_9
from retool.recipe.verl_plugins.v0_9.agent_loop import RetoolToolAgentLoop
from tests.recipe_tool.scripted_server import Script, scripted_sandbox
from tests.render.verl_config import compose_verl
from tests.verl09.lines import rendered

CODE = "x = 6 * 7\nprint(x)"
CALL_TURN = 'I will compute it.\n<tool_call>\n{"name": "code_interpreter", "arguments": ' + json.dumps({"code": CODE}) + "}\n</tool_call><|im_end|>"
ANSWER_TURN = "The product is \\boxed{42}.<|im_end|>"
PROBLEM = [{"role": "user", "content": "What is 6 times 7? Put the answer in \\boxed{}."}]


class ScriptedLLM:
    """verl 0.9.1's ``LLMServerClient.generate`` contract, answering with the next scripted turn's tokens."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.turns = [tokenizer.encode(turn, add_special_tokens=False) for turn in turns]
        self.prompts: list[list[int]] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        return TokenOutput(token_ids=self.turns.pop(0), stop_reason="completed")


def run_loop(qwen_model: str, sandbox_url: str, tmp_path: Path, turns: list[str], max_turns: int = 8) -> tuple[Any, ScriptedLLM, Any]:
    command = rendered("smoke-qwen0.5b", "rl")
    tool_config = tmp_path / "tool_config.yaml"
    tool_config.write_text(tool_config_yaml(sandbox_url=sandbox_url, timeout_s=10, memory_limit_mb=256, max_output_chars=1024, concurrency=2))
    arr = "actor_rollout_ref.rollout"
    changes = {
        "actor_rollout_ref.model.path": qwen_model,
        f"{arr}.multi_turn.tool_config_path": str(tool_config),
        f"{arr}.multi_turn.max_assistant_turns": max_turns,
        f"{arr}.multi_turn.max_user_turns": max_turns,
    }
    config = compose_verl("ppo_trainer", hydra_overrides({**command.overrides, **changes}))
    assert config[arr.split(".")[0]].rollout.agent.agent_loop_config_path == v0_9.AGENT_LOOP_CONFIG
    (entry,) = [e for e in OmegaConf.load(v0_9.AGENT_LOOP_CONFIG) if e.name == "tool_agent"]
    tokenizer = AutoTokenizer.from_pretrained(qwen_model)
    llm = ScriptedLLM(tokenizer, turns)
    tools = load_all_tools(tool_config_path=str(tool_config), function_tool_path=None)

    async def one_sample() -> Any:
        # Inside the event loop, as in verl's worker: the loop keeps the running loop for its tokenizer work.
        loop = hydra.utils.instantiate(
            entry,
            trainer_config=DictConfigWrap(config=config),
            server_manager=llm,
            tokenizer=tokenizer,
            processor=None,
            hf_model_type="qwen3",
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(tools),
        )
        assert isinstance(loop, RetoolToolAgentLoop)
        return await loop.run({"temperature": 1.0}, raw_prompt=PROBLEM, tools_kwargs={})

    output = asyncio.run(one_sample())
    return output, llm, tokenizer


@pytest.fixture
def sandbox() -> Any:
    script = Script()
    with scripted_sandbox(script) as url:
        yield script, url


def test_a_tool_call_runs_in_the_sandbox_and_is_recorded(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    script, url = sandbox
    output, llm, _ = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN])
    assert [r["code"] for r in script.requests] == [CODE]
    assert len(llm.prompts) == 2, "the loop asks the model again after the tool answered"
    record = output.extra_fields[RECORD_KEY]
    assert record["outcomes"] == ["ok"] and record["hit_max_turns"] is False
    assert record["response_tokens"] == len(output.response_ids)


def test_the_turn_format_is_the_chat_templates_and_only_the_models_tokens_are_trained(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    _, url = sandbox
    output, llm, tokenizer = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN])
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
    output, _, _ = run_loop(qwen_model, url, tmp_path, [bad, ANSWER_TURN])
    assert script.requests == []
    assert output.extra_fields[RECORD_KEY]["outcomes"] == ["malformed"]


def test_max_turns_is_recorded(qwen_model: str, sandbox: Any, tmp_path: Path) -> None:
    _, url = sandbox
    output, llm, _ = run_loop(qwen_model, url, tmp_path, [CALL_TURN, ANSWER_TURN], max_turns=1)
    assert len(llm.prompts) == 1
    assert output.extra_fields[RECORD_KEY]["hit_max_turns"] is True
