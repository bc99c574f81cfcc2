"""Tool-use dynamics through verl 0.6.1's own agent loop and trainer, read back from a real MLflow server.

The rl stage's command is rendered from an example, composed into verl's config as the stage composes
it (our agent loop registered as ``tool_agent``, our trainer), and run on CPU: the scripted model
(a stand-in vLLM server) answers 8 problems with rollouts whose figures are known by construction,
the code runs in our real sandbox, and verl's agent loop, reward loop and ``RayPPOTrainer`` code do
the rest. Of the 8 responses 3 run code (4 calls: 2 succeed, 1 raises, 1 times out), one reaches
``maxTurns`` and 4 are correct. The reward watch re-grades all 8 with math-verify, which rejects the
one answer with its unit (``\\boxed{2 m/s}``, which math-verify does not credit): a disagreement rate of
1/8, which at the test's benign rate (1 %) and a one-step horizon lifts the CUSUM over its limit, so the
disagreement table is logged and the rl run is tagged RewardSuspect.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow import MlflowClient
from verl.trainer.main_ppo import create_rl_dataset
from verl.workers.rollout.replica import TokenOutput

from retool.data.schema import RL_SCHEMA, rl_row
from retool.preflight.agent import InProcessRollout
from retool.preflight.trainer import RecordingRollout, build_trainer, training_step
from retool.preflight.verl_config import compose_stage, preflight_overrides, stage_files
from retool.recipe.render.stages import render_stage
from retool.recipe.verl_plugins.trainer import RetoolPPOTrainer
from retool.runtime.context import StageContext
from retool.spec.validate import parse_run
from tests.conftest import EXAMPLES
from tests.preflight.conftest import qwen_tokenizer, sandbox  # noqa: F401  (session fixtures)
from tests.tracking.conftest import MLflowServer
from tests.tracking.metric_sections import chart_section

MAX_TURNS = 3


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


# question -> (truth, the assistant turns the scripted model says, in order)
SCRIPTS: dict[str, tuple[str, list[str]]] = {
    # Some thought before the call: the first call's position is where the call begins, after it.
    "Problem one: what is 6 times 7?": ("42", ["Let me multiply the two numbers with code.\n" + call("print(6 * 7)"), "The interpreter says 42, so \\boxed{42}."]),
    "Problem two: what is 2 to the 10th?": ("1024", [call("x = 1 / 0"), call("x = 2 ** 10\nprint(x)"), "So \\boxed{1024}."]),
    "Problem three: how many primes below 10?": ("4", [call("while True:\n    pass"), "It ran too long; I guess \\boxed{3}."]),
    # Our reward credits a number with its unit; math-verify, given the same answer region, does not:
    # the one disagreement of the step (reward right, verifier wrong).
    "Problem four: a car covers 10 m in 5 s; what is its speed?": ("2", ["It moves at \\boxed{2 m/s}."]),
    "Problem five: what is 3 squared?": ("9", ["It is \\boxed{9}."]),
    "Problem six: what is 10 minus 4?": ("6", ["It is \\boxed{5}."]),
    "Problem seven: what is 8 divided by 2?": ("4", ["It is \\boxed{3}."]),
    "Problem eight: what is 5 plus 5?": ("10", ["I think \\boxed{11}."]),
}
KNOWN = {
    "code_ratio": 3 / 8,
    "calls_per_response_mean": 4 / 8,
    "calls_per_response_max": 2.0,
    "hit_max_turns_ratio": 1 / 8,
    "code_lines_per_call_mean": (1 + 1 + 2 + 2) / 4,
    "code_lines_per_response_mean": (1 + (1 + 2) + 2) / 3,
    "outcome_success_count": 2.0,
    "outcome_error_count": 1.0,
    "outcome_timeout_count": 1.0,
    "outcome_sandbox_failure_count": 0.0,
    "outcome_success_rate": 0.5,
    "outcome_timeout_rate": 0.25,
    "code_pass_rate_correct": 2 / 3,
    "code_pass_rate_incorrect": 0.0,
    "correct_ratio": 0.5,
    "responses": 8.0,
}


class ScriptServer:
    """Stands in for a vLLM server: the n-th request of a conversation gets the n-th scripted turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.turns: dict[str, int] = {}
        self.questions: dict[str, str] = {}
        self.first_call_starts: dict[str, int] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, image_data: Any = None) -> TokenOutput:
        if request_id not in self.questions:
            prompt = self.tokenizer.decode(prompt_ids)
            self.questions[request_id] = next(q for q in SCRIPTS if q in prompt)
            self.turns[request_id] = 0
        question, index = self.questions[request_id], self.turns[request_id]
        self.turns[request_id] += 1
        text = SCRIPTS[question][1][index] + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if index == 0 and "<tool_call>" in text:
            self.first_call_starts[question] = ids.index(self.tokenizer.convert_tokens_to_ids("<tool_call>"))
        return TokenOutput(token_ids=ids, log_probs=None)


def write_problems(path: Path) -> str:
    rows = [rl_row(data_source="dyn_test", question=q, ground_truth=truth, index=i, split="train", source_id=None) for i, (q, (truth, _)) in enumerate(SCRIPTS.items())]
    pq.write_table(pa.Table.from_pylist(rows, schema=RL_SCHEMA), path)
    return str(path)


@pytest.fixture
def stage(tmp_path: Path, qwen_tokenizer: str, sandbox: str) -> Any:  # noqa: F811
    example = next(p for p in EXAMPLES if p.stem == "retoolrun-minimal")
    raw = yaml.safe_load(example.read_text())
    raw["spec"].setdefault("rl", {}).update(maxTurns=MAX_TURNS, rewardWatch={"share": 1.0, "maxPerStep": 8, "benignRate": 0.01, "shift": 0.29, "falseAlarm": 0.5})
    run = parse_run(raw)
    command = render_stage(run, "rl", StageContext(run_name=run.metadata.name, namespace="default", sandbox_url=sandbox))
    copies = stage_files(command, tmp_path)
    for copy in copies.values():  # a 2 s execution limit, so the endless loop times out quickly
        tools = yaml.safe_load(Path(copy).read_text())
        tools["tools"][0]["config"].update(timeout_s=2.0)
        Path(copy).write_text(yaml.safe_dump(tools))
    data = write_problems(tmp_path / "problems.parquet")
    overrides = preflight_overrides(command, tokenizer=qwen_tokenizer, file_copies=copies, work_dir=tmp_path)
    overrides.update(
        {
            "trainer.logger": ["console", "mlflow"],
            "data.train_files": data,
            "data.val_files": [data],
            "data.train_batch_size": 8,
            "actor_rollout_ref.rollout.n": 1,
            "actor_rollout_ref.rollout.val_kwargs.n": 1,
            "actor_rollout_ref.rollout.agent.num_workers": 2,
            "+retool.reward_watch.share": 1.0,  # the preflight's overrides turn the watch off
            "+retool.reward_watch.horizon": 1,  # limit ln(1 / 0.5): one disagreement of 8 at a benign 1 % raises it
        }
    )
    return compose_stage(command, overrides)


def test_dynamics_of_scripted_rollouts_reach_mlflow_at_the_trainers_step(stage: Any, qwen_tokenizer: str, mlflow_server: MLflowServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from verl.utils import hf_tokenizer

    assert stage.actor_rollout_ref.rollout.agent.agent_loop_config_path, "the rendered rl stage registers our agent loop"
    client = MlflowClient(mlflow_server.uri)
    experiment = client.create_experiment("dynamics-e2e")
    run_id = client.create_run(experiment).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)

    tokenizer = hf_tokenizer(qwen_tokenizer)
    train = create_rl_dataset(stage.data.train_files, stage.data, tokenizer, None, is_train=True)
    val = create_rl_dataset(stage.data.val_files, stage.data, tokenizer, None, is_train=False)
    server = ScriptServer(tokenizer)
    with InProcessRollout(stage, server) as rollout:
        trainer = build_trainer(stage, tokenizer, train, val, RecordingRollout(rollout))
        assert isinstance(trainer, RetoolPPOTrainer)
        trainer.global_steps = 7
        result = training_step(trainer, train, list(range(8)))
        trainer.watcher.flush(timeout=300)
        val_metrics = trainer._validate()
        trainer.watcher.close()

    batch = result.batch
    records = batch.non_tensor_batch["retool_tools"]
    assert sum(1 for r in records if r["outcomes"]) == 3
    prompt_length = batch.batch["prompts"].shape[1]
    lengths = batch.batch["attention_mask"][:, prompt_length:].sum(-1).tolist()
    questions = [row["question"] for row in batch.non_tensor_batch["extra_info"]]
    correct = [SCRIPTS[q][0] in SCRIPTS[q][1][-1] for q in questions]
    coded = [i for i, q in enumerate(questions) if "<tool_call>" in SCRIPTS[q][1][0]]
    assert sorted(server.first_call_starts.values()) == [0, 0, len(tokenizer.encode("Let me multiply the two numbers with code.\n"))]
    position = sum(server.first_call_starts[questions[i]] / lengths[i] for i in coded) / len(coded)
    expected = {
        **KNOWN,
        "first_call_position_mean": position,
        "response_length_correct_mean": sum(n for n, c in zip(lengths, correct, strict=True) if c) / 4,
        "response_length_incorrect_mean": sum(n for n, c in zip(lengths, correct, strict=True) if not c) / 4,
    }

    for name, value in expected.items():
        history = client.get_metric_history(run_id, f"tool/{name}")
        assert [(m.step, pytest.approx(m.value)) for m in history] == [(7, value)], name
        assert val_metrics[f"val-tool/{name}"] == pytest.approx(value), name
    names = ("reward-watch/verified", "reward-watch/disagreement_rate", "reward-watch/reward_right_verifier_wrong", "reward-watch/reward_wrong_verifier_right")
    watched = {name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)] for name in names}
    assert watched == dict(zip(names, ([(7, 8.0)], [(7, 1 / 8)], [(7, 1 / 8)], [(7, 0.0)]), strict=True))
    table = json.loads(Path(client.download_artifacts(run_id, "reward-watch/step_000007.json")).read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    disagreement = ("Problem four: a car covers 10 m in 5 s; what is its speed?", "2", True, False)  # the answer as the reward normalized it
    assert [(r["problem"], r["answer"], r["reward_correct"], r["verifier_correct"]) for r in rows] == [disagreement]
    assert rows[0]["response_tail"].endswith("It moves at \\boxed{2 m/s}.")
    cusum = math.log(0.3 / 0.01) + 7 * math.log(0.7 / 0.99)
    assert [(m.step, pytest.approx(m.value)) for m in client.get_metric_history(run_id, "reward-watch/cusum")] == [(7, cusum)]
    assert "step 7: 1 of 8 disagreed" in client.get_run(run_id).data.tags["retool.rewardSuspect"]
    ours = [k for k in client.get_run(run_id).data.metrics if k.startswith(("tool/", "val-tool/", "reward-watch/"))]
    assert ours and all(chart_section(k) in ("tool", "val-tool", "reward-watch") for k in ours), sorted(ours)
    correct_without_success = client.get_metric_history(run_id, "reward-watch/correct_without_success")[0].value
    assert correct_without_success == pytest.approx(2 / 4), "problems four and five are correct without running code"
