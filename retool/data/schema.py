"""The layouts the data stages write, and the few constants other parts of the recipe must share.

verl reads these files as-is: the SFT trainer's ``MultiTurnSFTDataset`` (``messages`` + ``tools``),
and the RL trainer's ``RLHFDataset`` / our ``retool.recipe.verl_plugins.dataset`` (``prompt``, ``reward_model``,
``agent_name`` ...). Writing with explicit Arrow schemas keeps every file identical in shape whatever
the source looked like, so a type drift in one input row is a reported malformed row, not a
silently different column type.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from retool.recipe.tool.config import TOOL_NAME, code_interpreter_tool  # noqa: F401  (one schema for SFT data, RL prompts and the tool)
from retool.recipe.verl_plugins import SINGLE_TURN_AGENT, TOOL_AGENT

AGENT_NAME = TOOL_AGENT
"""verl 0.6.1's agent loop reads the top-level ``agent_name`` of each row (``AgentLoopWorker``) and
runs the loop registered under it; ``tool_agent`` is ``ToolAgentLoop``, the multi-turn loop with tools.
Rows of a text-only run (``spec.recipe: text-only``) name ``SINGLE_TURN_AGENT`` instead."""
TEXT_AGENT_NAME = SINGLE_TURN_AGENT


def agent_name_for(recipe: str) -> str:
    """The agent loop a run's RL and eval rows name: ``spec.recipe`` decides (the text-only baseline's
    prompts go to verl's single-turn loop, rendered without the tool schema). The prepare stage writes
    it into every row; the preflight checks the prepared rows against it."""
    return AGENT_NAME if recipe == "tool-integrated" else TEXT_AGENT_NAME


ANSWER_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The single answer-format instruction appended to every RL and eval prompt.

The reward (``retool.recipe.reward.score``) takes the last ``\\boxed{...}`` of the response and falls back to an
``Answer:`` line; DAPO's own "Answer: $Answer" instruction is removed first, so a prompt never asks
for two formats at once (the public recipe appended a \\boxed instruction to prompts that already
asked for "Answer:")."""

RL_TRAIN_SPLIT = "train"
EVAL_SPLIT = "test"


TOOL_CALL_TYPE = pa.struct(
    [
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.struct([("code", pa.string())]))])),
    ]
)
"""Arguments are stored as a struct (a dict once read), not a JSON string: Qwen-style chat templates
render them with ``tojson``, which would double-encode a string."""

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE))])

TOOL_SCHEMA_TYPE = pa.struct(
    [
        ("type", pa.string()),
        (
            "function",
            pa.struct(
                [
                    ("name", pa.string()),
                    ("description", pa.string()),
                    (
                        "parameters",
                        pa.struct(
                            [
                                ("type", pa.string()),
                                ("properties", pa.struct([("code", pa.struct([("type", pa.string()), ("description", pa.string())]))])),
                                ("required", pa.list_(pa.string())),
                            ]
                        ),
                    ),
                ]
            ),
        ),
    ]
)

SFT_SCHEMA = pa.schema([("messages", pa.list_(MESSAGE_TYPE)), ("tools", pa.list_(TOOL_SCHEMA_TYPE)), ("data_source", pa.string())])

PROMPT_MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])

RL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(PROMPT_MESSAGE_TYPE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct([("index", pa.int64()), ("split", pa.string()), ("source_id", pa.string()), ("question", pa.string())]),
        ),
        ("agent_name", pa.string()),
    ]
)
"""verl's RL row: ``prompt`` is the chat, ``reward_model.ground_truth`` goes to ``compute_score``,
``extra_info.index`` becomes the sample index, ``agent_name`` picks the agent loop. Eval files share it."""


def rl_row(
    *, data_source: str, question: str, ground_truth: str, index: int, split: str, source_id: str | None, ability: str = "MATH", agent_name: str = AGENT_NAME
) -> dict[str, Any]:
    """One RL/eval row in ``RL_SCHEMA``: the question followed by the one answer instruction."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split, "source_id": source_id, "question": question},
        "agent_name": agent_name,
    }
