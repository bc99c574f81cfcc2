"""Score responses through verl 0.6.1's own reward manager (load_reward_manager -> NaiveRewardManager).

Run as ``python -m tests.recipe_reward.verl_naive_manager REWARD_FILE``; prints one JSON line. Kept out
of the pytest process because verl registers the reward file as the global module ``custom_module``.
A byte-level tokenizer built here stands in for a model tokenizer (no hub access in tests).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl import DataProto
from verl.trainer.ppo.reward import load_reward_manager

PROMPT_LEN, RESPONSE_LEN = 16, 96

# (prompt, response, ground truth, extra_info)
ROWS = [
    ("Solve: x", "We get \\boxed{204}.", "204", {"num_turns": 2}),
    ("Solve: y", "<interpreter>\\boxed{9}</interpreter>\nAnswer: 8", "9", {"num_turns": 4}),
]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<pad>"] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>")


def batch(tok: PreTrainedTokenizerFast) -> DataProto:
    """Left-padded prompts, right-padded responses, as verl's rollout produces them."""
    pad = tok.pad_token_id
    prompts, responses, masks = [], [], []
    for prompt, response, _, _ in ROWS:
        p = tok.encode(prompt)[-PROMPT_LEN:]
        r = tok.encode(response)[:RESPONSE_LEN]
        prompts.append([pad] * (PROMPT_LEN - len(p)) + p)
        responses.append(r + [pad] * (RESPONSE_LEN - len(r)))
        masks.append([0] * (PROMPT_LEN - len(p)) + [1] * (len(p) + len(r)) + [0] * (RESPONSE_LEN - len(r)))
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor(prompts), "responses": torch.tensor(responses), "attention_mask": torch.tensor(masks)},
        non_tensors={
            "data_source": np.array(["aime_2024", "dapo"], dtype=object),
            "reward_model": np.array([{"ground_truth": truth} for _, _, truth, _ in ROWS], dtype=object),
            "extra_info": np.array([extra for *_, extra in ROWS], dtype=object),
        },
    )


def main(reward_file: str) -> None:
    tok = byte_tokenizer()
    config = OmegaConf.create(
        {
            "custom_reward_function": {"path": reward_file, "name": "compute_score", "reward_kwargs": {"tool_turn_shaping": True}},
            "reward_model": {"reward_manager": "naive"},
            "data": {"reward_fn_key": "data_source"},
        }
    )
    manager = load_reward_manager(config, tok, num_examine=0)
    out = manager(batch(tok), return_dict=True)
    tensor = out["reward_tensor"]
    last = [len(tok.encode(response)) - 1 for _, response, _, _ in ROWS]
    print(
        json.dumps(
            {
                "at_last_token": [float(tensor[i, last[i]]) for i in range(len(ROWS))],
                "row_sums": [float(tensor[i].sum()) for i in range(len(ROWS))],
                "extra": {key: [v.item() if hasattr(v, "item") else v for v in values] for key, values in out["reward_extra_info"].items()},
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
