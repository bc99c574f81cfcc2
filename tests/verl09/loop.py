"""One sample through our 0.9 agent loop the way verl 0.9.1's ``AgentLoopWorker`` runs it, on CPU.

The tools come from verl's registry (``load_all_tools``) reading the rendered tool config; the loop class
comes from the rendered ``agent_loop_config_path`` (our YAML), instantiated with hydra as verl does, given
the tools through the constructor (``ToolListWrap``) and the model family from the model's config.json
(``AgentLoopWorker`` passes ``hf_config.model_type``: it picks the Continuous Token builder); the LLM
server is scripted (a model's tokens, ending in its end-of-turn token).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import hydra
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from retool.recipe.render.command import hydra_overrides
from retool.recipe.tool.config import tool_config_yaml
from retool.recipe.verl_plugins import v0_9
from retool.recipe.verl_plugins.v0_9.agent_loop import RetoolToolAgentLoop
from tests.render.verl_config import compose_verl
from tests.verl09.lines import rendered

PROBLEM = [{"role": "user", "content": "What is 6 times 7? Put the answer in \\boxed{}."}]


class ScriptedLLM:
    """verl 0.9.1's ``LLMServerClient.generate`` contract, answering with the next scripted turn's tokens."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.turns = [tokenizer.encode(turn, add_special_tokens=False) for turn in turns]
        self.prompts: list[list[int]] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        return TokenOutput(token_ids=self.turns.pop(0), stop_reason="completed")


def run_loop(
    qwen_model: str,
    sandbox_url: str,
    tmp_path: Path,
    turns: list[str],
    max_turns: int = 8,
    prompt: list[dict[str, Any]] | None = None,
    retry_deadline_s: float | None = None,
) -> tuple[Any, ScriptedLLM, Any, Any]:
    """(the loop's output, the scripted server with every prompt it was sent, the tokenizer, the sample's ``AgentData``).

    ``retry_deadline_s`` shortens how long a call waits for a sandbox that is down."""
    command = rendered("smoke-qwen0.5b", "rl")
    tool_config = tmp_path / "tool_config.yaml"
    tools = yaml.safe_load(tool_config_yaml(sandbox_url=sandbox_url, timeout_s=10, memory_limit_mb=256, max_output_chars=1024, concurrency=2))
    if retry_deadline_s is not None:
        tools["tools"][0]["config"].update(timeout_s=retry_deadline_s / 2, retry_deadline_s=retry_deadline_s)
    tool_config.write_text(yaml.safe_dump(tools))
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
            hf_model_type=json.loads((Path(qwen_model) / "config.json").read_text())["model_type"],
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(tools),
        )
        assert isinstance(loop, RetoolToolAgentLoop)
        return await loop.run({"temperature": 1.0}, raw_prompt=[dict(m) for m in (prompt or PROBLEM)], tools_kwargs={}), loop._agent_data

    output, data = asyncio.run(one_sample())
    return output, llm, tokenizer, data
