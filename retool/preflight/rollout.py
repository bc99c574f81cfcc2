"""What a scripted rollout must look like once verl's agent loop has run it.

A ReTool episode calls the interpreter once and answers with what it printed, so each sample of the
agent loop's output must show: two assistant turns and one tool turn (``__num_turns__`` 4), the
sandbox's output in the response with ``response_mask`` 0 (context, not trained on) and never among
the tokens with mask 1. A text-only episode is one answer through verl's ``single_turn_agent``
(``__num_turns__`` 2): one request to the model, no tool schema in the prompt and every response
token trained on. Either way the reward of a right answer is in ``rm_scores`` at the last token,
and verl ran every sample with the agent loop the run's recipe uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from verl import DataProto

from retool.data.schema import AGENT_NAME, TEXT_AGENT_NAME
from retool.preflight.episodes import OUTPUT_LABEL
from retool.preflight.scripted import Transcript
from retool.recipe.tool.config import TOOL_NAME

MAX_LISTED = 5


@dataclass(frozen=True)
class Shape:
    """What every scripted rollout of an agent loop must show."""

    agent: str
    turns: int
    """verl's ``num_turns`` of a scripted episode."""
    turns_text: str
    requests: int
    """Requests one rollout sends the model."""
    calls_tool: bool


TOOL_ROLLOUT = Shape(AGENT_NAME, 4, "prompt, tool call, tool output, answer", 2, True)
SINGLE_TURN_ROLLOUT = Shape(TEXT_AGENT_NAME, 2, "prompt, answer", 1, False)


@dataclass(frozen=True)
class Limits:
    """The spec fields that end an episode, with their values, for messages that name them."""

    max_turns: int
    max_turns_field: str
    max_response_length: int
    max_response_length_field: str = "spec.rl.maxResponseLength"


def silent_reason(transcripts: Sequence[Transcript], shape: Shape, limits: Limits | None) -> str:
    """Why rollouts stopped after the tool call, naming the spec field when a limit did it."""
    count = len(transcripts)
    if limits is not None and limits.max_turns < shape.requests:
        return (
            f"{count} rollouts stopped after the tool call: {limits.max_turns_field}: {limits.max_turns} ends every episode after the model's first turn, "
            f"so the tool's output never reaches the model; a tool-integrated run needs at least {shape.requests}"
        )
    first = max((t.reply_tokens[0] for t in transcripts if t.reply_tokens), default=0)
    if limits is not None and first >= limits.max_response_length:
        return (
            f"{count} rollouts stopped after the tool call: {limits.max_response_length_field}: {limits.max_response_length} tokens are used up by the "
            f"first turn alone ({first} tokens of reasoning and code), so the episode ends before the model sees the tool's output and answers"
        )
    if limits is not None and first:
        return (
            f"{count} rollouts stopped after the tool call: {limits.max_response_length_field}: {limits.max_response_length} tokens leave "
            f"{limits.max_response_length - first} after the first turn ({first} tokens of reasoning and code), which the tool's output and the answer "
            "must share: verl ends the episode when the response budget is spent (with an ample budget, the rollout's tool parser found no call in the "
            "SFT-format turn)"
        )
    return f"{count} rollouts stopped after the tool call: the rollout's tool parser found no call in the SFT-format turn, or a limit ended the episode"


def shape_of(uses_tools: bool) -> Shape:
    return TOOL_ROLLOUT if uses_tools else SINGLE_TURN_ROLLOUT


def sample_problems(output: DataProto, index: int, tokenizer: Any, right_score: float, shape: Shape = TOOL_ROLLOUT) -> list[str]:
    batch = output.batch
    problems = []
    turns = int(output.non_tensor_batch["__num_turns__"][index])
    if turns != shape.turns:
        problems.append(f"{turns} turns instead of {shape.turns} ({shape.turns_text})")
    prompt_length = batch["prompts"].shape[1]
    responses = batch["responses"][index]
    mask = batch["response_mask"][index].bool()
    attended = batch["attention_mask"][index, prompt_length:].bool()
    if shape.calls_tool:
        tool_text = tokenizer.decode(responses[attended & ~mask].tolist())
        model_text = tokenizer.decode(responses[mask].tolist())
        if OUTPUT_LABEL not in tool_text:
            problems.append(f"the sandbox's output is not in the tool turn (response_mask 0): {tool_text[:200]!r}")
        if OUTPUT_LABEL in model_text:
            problems.append("the sandbox's output is among the tokens the actor is trained on (response_mask 1)")
    else:
        untrained = int((attended & ~mask).sum())
        if untrained:
            problems.append(f"{untrained} response tokens have response_mask 0: a single-turn rollout trains on its whole response")
        prompt = batch["prompts"][index][batch["attention_mask"][index, :prompt_length].bool()]
        if TOOL_NAME in tokenizer.decode(prompt.tolist()):
            problems.append(f"the prompt offers the {TOOL_NAME} tool: a text-only run's prompts carry no tool schema")
    if "rm_scores" not in batch.keys():  # noqa: SIM118  (TensorDict membership goes through keys())
        problems.append("no rm_scores: the agent loop did not score the rollout through the reward loop")
    else:
        score = float(torch.as_tensor(batch["rm_scores"][index]).sum())
        if abs(score - right_score) > 1e-6:
            problems.append(f"scored {score:g}, a right answer scores {right_score:g}")
    return problems


def rollout_problems(
    outputs: Sequence[DataProto],
    transcripts: Sequence[Transcript],
    tokenizer: Any,
    right_score: float,
    shape: Shape = TOOL_ROLLOUT,
    agents: Mapping[str, int] | None = None,
    limits: Limits | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Problems across every sample the agent loop produced, and counts for the report.

    ``agents``: samples per agent loop verl ran them with (``InProcessRollout.agents``)."""
    problems: list[str] = []
    other_agents = {name: count for name, count in (agents or {}).items() if name != shape.agent}
    if other_agents:
        problems.append(f"verl ran {sum(other_agents.values())} rollouts with the agent loop {', '.join(map(repr, other_agents))}, the run's recipe uses {shape.agent!r}")
    if shape.calls_tool:
        silent = [t for t in transcripts if t.turns < shape.requests]
        if silent:
            problems.append(silent_reason(silent, shape, limits))
        unseen = [t for t in transcripts if t.tool_output_seen is False]
        if unseen:
            problems.append(f"{len(unseen)} rollouts never saw the sandbox's output; the tool turn read: {unseen[0].tool_turn_texts[-1][:300]!r}")
    else:
        repeated = [t for t in transcripts if t.turns != shape.requests]
        if repeated:
            problems.append(f"{len(repeated)} rollouts asked the model {repeated[0].turns} times; a single-turn rollout asks once")
    samples = 0
    for output in outputs:
        for index in range(len(output)):
            samples += 1
            problems += [f"sample {samples}: {p}" for p in sample_problems(output, index, tokenizer, right_score, shape)]
    facts = {"agent_loop": shape.agent, "samples": samples, "requests": len(transcripts), "tool_calls": sum(len(t.tool_turn_texts) for t in transcripts)}
    if agents:
        facts["agents"] = dict(agents)
    if len(problems) > MAX_LISTED:
        problems = [*problems[:MAX_LISTED], f"... and {len(problems) - MAX_LISTED} more"]
    return problems, facts
