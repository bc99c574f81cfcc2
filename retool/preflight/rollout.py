"""What a scripted rollout must look like once verl's agent loop has run it.

Every scripted episode calls the interpreter once and answers with what it printed, so each sample
of the agent loop's output must show: two assistant turns and one tool turn (``__num_turns__`` 4),
the sandbox's output in the response with ``response_mask`` 0 (context, not trained on) and never
among the tokens with mask 1, and the reward of a right answer in ``rm_scores`` at the last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from verl import DataProto

from retool.preflight.agent import Transcript
from retool.preflight.episodes import OUTPUT_LABEL

SCRIPTED_TURNS = 4
"""verl's ``num_turns`` of a scripted episode: the prompt, the tool call, the tool turn, the answer."""
MAX_LISTED = 5


def sample_problems(output: DataProto, index: int, tokenizer: Any, right_score: float) -> list[str]:
    batch = output.batch
    problems = []
    turns = int(output.non_tensor_batch["__num_turns__"][index])
    if turns != SCRIPTED_TURNS:
        problems.append(f"{turns} turns instead of {SCRIPTED_TURNS} (prompt, tool call, tool output, answer)")
    prompt_length = batch["prompts"].shape[1]
    responses = batch["responses"][index]
    mask = batch["response_mask"][index].bool()
    attended = batch["attention_mask"][index, prompt_length:].bool()
    tool_text = tokenizer.decode(responses[attended & ~mask].tolist())
    model_text = tokenizer.decode(responses[mask].tolist())
    if OUTPUT_LABEL not in tool_text:
        problems.append(f"the sandbox's output is not in the tool turn (response_mask 0): {tool_text[:200]!r}")
    if OUTPUT_LABEL in model_text:
        problems.append("the sandbox's output is among the tokens the actor is trained on (response_mask 1)")
    if "rm_scores" not in batch.keys():  # noqa: SIM118  (TensorDict membership goes through keys())
        problems.append("no rm_scores: the agent loop did not score the rollout through the reward loop")
    else:
        score = float(torch.as_tensor(batch["rm_scores"][index]).sum())
        if abs(score - right_score) > 1e-6:
            problems.append(f"scored {score:g}, a right answer scores {right_score:g}")
    return problems


def rollout_problems(outputs: Sequence[DataProto], transcripts: Sequence[Transcript], tokenizer: Any, right_score: float) -> tuple[list[str], dict[str, Any]]:
    """Problems across every sample the agent loop produced, and counts for the report."""
    problems: list[str] = []
    silent = [t for t in transcripts if t.turns < 2]
    if silent:
        problems.append(f"{len(silent)} rollouts stopped after the tool call: the rollout's tool parser found no call in the SFT-format turn, or a limit ended the episode")
    unseen = [t for t in transcripts if t.tool_output_seen is False]
    if unseen:
        problems.append(f"{len(unseen)} rollouts never saw the sandbox's output; the tool turn read: {unseen[0].tool_turn_texts[-1][:300]!r}")
    samples = 0
    for output in outputs:
        for index in range(len(output)):
            samples += 1
            problems += [f"sample {samples}: {p}" for p in sample_problems(output, index, tokenizer, right_score)]
    facts = {"samples": samples, "requests": len(transcripts), "tool_calls": sum(len(t.tool_turn_texts) for t in transcripts)}
    if len(problems) > MAX_LISTED:
        problems = [*problems[:MAX_LISTED], f"... and {len(problems) - MAX_LISTED} more"]
    return problems, facts
