"""The rehearsal's RetoolRun and its raw data: a pure function of where things are and how big the run is.

The run is an ordinary RetoolRun (``hardware.accelerator: cpu``, ``rl.rolloutEngine: hf``, the 0.9
line) whose base model is a directory on its claim, as a user's uploaded model would be, and whose
data are local files the prepare stage reads like any source:

- SFT: the demo's rehearsal trajectories (``retool/demo/data/rehearsal_sft.jsonl``, outputs made
  by the sandbox);
- RL: the same problems as DAPO-Math rows (the public RL set's layout: the prepare stage replaces
  its instruction with the one the SFT prompts get, so RL prompts are the SFT prompts);
- eval: the demo's AIME-format problems (``aime_demo``: new to the model) and the rehearsal's own
  (``rehearsal``: the memorised ones, where a trained model scores and a random one cannot).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.demo.samples import EVAL_FILE, REHEARSAL_SFT_FILE, REHEARSAL_SOURCES

RUN_NAME = "rehearsal"
NAMESPACE = "default"
EXPERIMENT = "retool-demo"
MODEL_DIR = "models/tiny-qwen2.5"
"""The tiny model's place on the run's claim (``storage.pvc.mountPath``), read in place like a user's upload."""

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer "
    "(without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
"""The instruction around every prompt of BytedTsinghua-SIA/DAPO-Math-17k, which the prepare stage replaces."""


@dataclass(frozen=True)
class Size:
    """How much the rehearsal trains: the demo's and the test's differ only here."""

    sft_epochs: int = 40
    sft_save_freq: int = 78
    """Mid-epoch on purpose (4 rows a epoch): a retry after it must resume inside the epoch, without replaying its rows."""
    rl_steps: int = 2
    rl_save_freq: int = 1
    """The test saves only at its last step, so its first attempt's checkpoint at step 1 is the one it asked for (save on notice)."""
    rl_batch: int = 2
    rollout_n: int = 4
    eval_samples: int = 2
    sft_learning_rate: float = 3e-3
    rl_learning_rate: float = 1e-4
    """Large for RL, so that two steps visibly move a model whose merge rounds every weight to bfloat16."""
    rl_temperature: float = 0.8
    """The tiny model memorises its trajectories to ~0.05 nats a token: sampled at 1.0 it writes the memorised tool
    call exactly in 23 % of rollouts, at 0.8 in 66 %, at 0.6 in 78 % (64 samples each, measured). 0.8 makes a
    rewarded rollout near-certain in step 1 and leaves each group mixed, which GRPO's advantage needs."""


DEMO = Size()


def rl_rows() -> list[dict[str, Any]]:
    """The rehearsal problems in DAPO-Math's layout."""
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": DAPO_PREFIX + source.question + DAPO_SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": source.answer, "style": "rule"},
            "extra_info": {"index": f"rehearsal-{i}"},
        }
        for i, source in enumerate(REHEARSAL_SOURCES)
    ]


def eval_rows() -> list[dict[str, Any]]:
    """The rehearsal problems in AIME's layout (``problem``, ``answer``)."""
    return [{"id": f"rehearsal-{i}", "problem": source.question, "answer": source.answer} for i, source in enumerate(REHEARSAL_SOURCES)]


def write_sources(directory: Path) -> dict[str, Any]:
    """The raw RL and eval files under ``directory``; returns the run's ``spec.data``."""
    directory.mkdir(parents=True, exist_ok=True)
    rl, own = directory / "rl.jsonl", directory / "rehearsal_eval.jsonl"
    rl.write_text("".join(json.dumps(row) + "\n" for row in rl_rows()), encoding="utf-8")
    own.write_text("".join(json.dumps(row) + "\n" for row in eval_rows()), encoding="utf-8")
    return {
        "sft": str(REHEARSAL_SFT_FILE),
        "rl": str(rl),
        "eval": [{"name": "aime_demo", "source": str(EVAL_FILE)}, {"name": "rehearsal", "source": str(own)}],
    }


def claim_root(root: Path) -> Path:
    """The directory that stands for the run's claim (``storage.pvc.mountPath``)."""
    return root / "pvc"


def rehearsal_run(root: Path, data: dict[str, Any], size: Size = DEMO) -> dict[str, Any]:
    """The rehearsal's RetoolRun document (``root``: where its claim and sources live)."""
    claim = claim_root(root)
    return {
        "apiVersion": "retool.dev/v1alpha1",
        "kind": "RetoolRun",
        "metadata": {"name": RUN_NAME, "namespace": NAMESPACE},
        "spec": {
            "model": {"base": str(claim / MODEL_DIR), "sizeBillions": 0.01},
            "trainer": {"verl": "0.9.1"},
            "hardware": {
                "accelerator": "cpu",
                "nodes": 1,
                "devicesPerNode": 1,
                "resources": {"requests": {"cpu": "2", "memory": "12Gi"}, "limits": {"memory": "16Gi"}},
                "sharedMemory": "2Gi",
            },
            "storage": {"pvc": {"mountPath": str(claim)}},
            "data": data,
            "sft": {
                "epochs": size.sft_epochs,
                "batchSize": 1,
                "microBatchSizePerDevice": 1,
                "maxLength": 512,
                "sequenceParallel": 1,
                "learningRate": size.sft_learning_rate,
                "saveFreq": size.sft_save_freq,
            },
            "rl": {
                "rolloutEngine": "hf",
                "steps": size.rl_steps,
                "batchSize": size.rl_batch,
                "miniBatchSize": size.rl_batch,
                "rolloutN": size.rollout_n,
                "maxTurns": 2,
                "maxPromptLength": 320,
                "maxResponseLength": 256,
                "learningRate": size.rl_learning_rate,
                "temperature": size.rl_temperature,
                "tensorParallel": 1,
                "sequenceParallel": 1,
                "offload": False,
                "saveFreq": size.rl_save_freq,
                "testFreq": size.rl_steps,
                "valBeforeTrain": False,
                "logValGenerations": 4,
            },
            "eval": {"samplesPerProblem": size.eval_samples},
            "sandbox": {"maxConcurrent": 4, "perReplicaConcurrency": 4},
            "tracking": {"mlflow": {"experiment": EXPERIMENT}},
        },
    }
