"""Tool-use dynamics and reward watch: the trainer's cost per step, at the recipe's batch (512 x 16).

Builds a verl ``DataProto`` shaped as the rl stage's scored batch: 8192 responses, prompts padded to
2048 tokens and responses to 16384 (int64 tensors, as verl keeps them), response lengths drawn
around 6000 tokens, and an agent-loop record per response (0-8 calls with ReTool-like outcomes).
Times :meth:`BatchWatcher.observe` - what a training step waits for - and, separately, the
background work of one step (decode + math-verify of the sampled responses, off the training path).

    .venv/bin/python bench/bench_dynamics.py [--prompts 512] [--n 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from verl import DataProto

from retool.recipe.dynamics import RECORD_KEY, tool_record
from retool.recipe.reward_watch import WatchSettings
from retool.recipe.verl_plugins.watch import BatchWatcher

PROMPT, RESPONSE = 2048, 16384
OUTCOMES = ["ok"] * 7 + ["code_failed"] * 2 + ["timeout"]


class DigitTokenizer:
    """Decodes ids to digits (the bench measures the watch, not a tokenizer)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(str(i % 10) for i in ids[-400:]) + " so the answer is \\boxed{42}"


def scored_batch(responses: int, seed: int = 0) -> tuple[DataProto, torch.Tensor]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.normal(6000, 3000, responses), 200, RESPONSE).astype(np.int64)
    positions = torch.arange(RESPONSE)
    response_mask = (positions[None, :] < torch.from_numpy(lengths)[:, None]).long()
    attention = torch.cat([torch.ones(responses, PROMPT, dtype=torch.long), response_mask], dim=1)
    records = np.empty(responses, dtype=object)
    for i in range(responses):
        calls = int(rng.integers(0, 9))
        outcomes = [OUTCOMES[j] for j in rng.integers(0, len(OUTCOMES), calls)]
        records[i] = tool_record(outcomes, rng.integers(1, 30, calls).tolist(), int(lengths[i] * rng.random()), outputs=["42"] * calls, response_tokens=int(lengths[i]))
    truth = np.array([{"ground_truth": "42"} for _ in range(responses)], dtype=object)
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.zeros(responses, PROMPT, dtype=torch.long),
            "responses": torch.randint(0, 150000, (responses, RESPONSE)),
            "attention_mask": attention,
        },
        non_tensors={RECORD_KEY: records, "reward_model": truth, "pred": np.array(["42"] * responses, dtype=object)},
    )
    right = rng.random(responses) < 0.4
    scores = torch.zeros(responses, RESPONSE)
    scores[torch.arange(responses), torch.from_numpy(lengths - 1)] = torch.from_numpy(np.where(right, 1.0, -1.0)).float()
    data.non_tensor_batch["acc"] = right.astype(np.float64)  # our reward's extra info, which verl keeps in the batch
    return data, scores


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text-only", action="store_true", help="no agent-loop records (the text-only baseline): lengths from the mask")
    args = parser.parse_args()
    responses = args.prompts * args.n
    data, scores = scored_batch(responses)
    if args.text_only:
        del data.non_tensor_batch[RECORD_KEY]
    settings = WatchSettings()  # the spec's defaults: 2 %, at most 64 per step
    watcher = BatchWatcher(tokenizer=DigitTokenizer(), response_length=RESPONSE, settings=settings, use_mlflow=False)
    path, background = [], []
    try:
        for step in range(1, args.repeats + 1):
            start = time.perf_counter()
            watcher.observe(data, scores, {}, step=step, validate=False)
            path.append(time.perf_counter() - start)
            start = time.perf_counter()
            watcher.flush()
            background.append(time.perf_counter() - start)
        start = time.perf_counter()
        watcher.start_validation()
        watcher.observe(data, scores, {}, step=0, validate=True)
        watcher.finish_validation(step=0)
        validation = time.perf_counter() - start
    finally:
        watcher.close()
    print(f"{responses} responses ({args.prompts} x {args.n}), prompt {PROMPT} + response {RESPONSE} tokens{', text-only' if args.text_only else ''}")
    print(f"training path per step (observe): median {statistics.median(path):.3f} s, max {max(path):.3f} s over {len(path)} steps")
    later = statistics.median(background[1:] or background)
    print(f"background per step (decode + math-verify of {min(64, responses)} samples): first {background[0]:.2f} s (verifier process start), then median {later:.2f} s")
    print(f"validation round of the same size (observe + reduce): {validation:.3f} s")


if __name__ == "__main__":
    main()
