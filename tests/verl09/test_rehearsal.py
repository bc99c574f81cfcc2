"""A RetoolRun that really trains: every stage's own command on this CPU, a tiny Qwen2.5, and the seams between them.

One rehearsal (``retool.rehearsal``) runs for this module, as far as its tests need (a run of only the
SFT tests stops after SFT), the way the operator runs a run
whose nodes fail: prepare, preflight, sft (its pod deleted after its mid-epoch checkpoint, then a
second attempt), merge, rl (deleted after its first step's checkpoint, then a second attempt),
eval. Each stage is ``python3 -m retool.stage STAGE`` with the stage context the operator sets, our
sandbox and a real MLflow server. The tests then read what production writes (MLflow, the claim,
verl's rollout dumps) and assert each seam where the next stage depends on the last:

- SFT -> merge -> RL: RL's first step calls the tool and earns a positive reward on the prompts the
  SFT memorised, which a random model cannot (the base model's own rollouts are shown to earn none);
- RL's update: the RL model's weights differ from the merged SFT model's;
- RL -> eval: the eval stage serves the merged RL checkpoint and scores the memorised set;
- resume: each second attempt continues the global step and its data loader where the first
  stopped (no replayed rows), on the real checkpoints.

docs/rehearsal.md says what this proves and what it cannot (GPU kernels, NCCL, vLLM, scale).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool.embedded.servers import mlflow_server
from retool.recipe.render.cpu import ROLLOUTS_DIR
from retool.rehearsal.pipeline import Rehearsal, RehearsalConfig, set_up
from retool.rehearsal.runner import Attempt
from retool.rehearsal.spec import Size
from retool.rehearsal.summary import summarize, summary_lines
from retool.runtime.paths import run_paths
from retool.tracking import naming, request_save
from retool.tracking._client import client
from retool.tracking.naming import RESUMED_FROM_TAG, SAVE_REQUEST_TAG, SAVED_ON_NOTICE_TAG
from tests.preflight.conftest import sandbox  # noqa: F401  (session fixture: our sandbox server)

pytestmark = pytest.mark.slow

SIZE = Size(sft_epochs=40, sft_save_freq=78, rl_steps=2, rl_save_freq=2, rl_batch=2, rollout_n=4, eval_samples=1)
"""The demo's training (fewer epochs leave the model unable to reproduce its tool call when sampled), one eval
sample per problem: the test needs a score above 0, not an estimate. RL saves on schedule only at step 2: the
checkpoint at step 1 that the first attempt is lost after is the one the operator's save request asked for."""
SAVE_REQUEST = "node kwok-node-1 is going: cordoned (spec.unschedulable)"
"""What the operator writes on the rl attempt's run when a node under it is marked as going (``retool_operator.notice``)."""
ROWS = 4
THREADS = 1
"""torch's threads per training process: `make test` runs this beside the rest of the suite (``Machine.threads``)."""


def tracker_step(directory: Path) -> int | None:
    tracker = directory / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


PLAN: tuple[tuple[str, int, str | None, int | None], ...] = (
    ("prepare", 1, None, None),
    ("preflight", 1, None, None),
    ("sft", 1, "sft_checkpoints", SIZE.sft_save_freq),
    ("sft", 2, None, None),
    ("merge", 1, None, None),
    ("rl", 1, "rl_checkpoints", 1),
    ("rl", 2, None, None),
    ("eval", 1, None, None),
)
"""Every attempt, in order: (stage, attempt, the checkpoint directory whose step ends it as a lost pod, that step)."""
LOGGED = {"sft": "train/loss", "rl": "critic/score/mean"}
"""A key verl logs at every step of the stage, in the one MLflow call that carries all of the step's metrics.
verl 0.9.1's PPO loop saves the step's checkpoint before it dumps the step's rollouts and logs its metrics
(``RayPPOTrainer.fit``, verl/trainer/ppo/ray_trainer.py): a pod lost right at the checkpoint loses those, and
the tests read them, so the attempt ends once both the checkpoint and the step's metrics are there."""


@dataclass
class Done:
    """The rehearsal, run as far as a test needs (``through``): a test of SFT does not wait for RL."""

    rehearsal: Rehearsal
    attempts: dict[tuple[str, int], Attempt]

    def through(self, stage: str) -> Done:
        """Run every planned attempt up to and including ``stage``'s last (those not run yet)."""
        last = max(i for i, planned in enumerate(PLAN) if planned[0] == stage)
        paths = run_paths(self.rehearsal.run)
        for name, attempt, directory, step in PLAN[: last + 1]:
            if (name, attempt) in self.attempts:
                continue
            stop_when = None
            if directory is not None:
                where = Path(getattr(paths, directory))
                stop_when = lambda where=where, step=step, name=name, attempt=attempt: tracker_step(where) == step and step in self.logged(name, attempt)  # noqa: E731
            if (name, attempt) == ("rl", 1):
                stop_when = self._requesting_save(stop_when)
            result = self.rehearsal.run_stage(name, attempt, stop_when=stop_when)
            self.attempts[(name, attempt)] = result
            if directory is not None:
                assert result.stopped, f"{name} attempt {attempt} ended (status {result.status}) before its checkpoint at step {step}: {result.log}"
            else:
                assert result.status == 0, f"{name} attempt {attempt} failed: {result.log}\n" + result.log.read_text(errors="replace")[-4000:]
        return self

    def _requesting_save(self, stop_when: Callable[[], bool]) -> Callable[[], bool]:
        """``stop_when``, which first asks the running rl attempt to save, as the operator does once its run exists."""
        asked: list[str] = []

        def check() -> bool:
            if not asked:
                run_id = request_save(self.rehearsal.config.mlflow_uri, self.rehearsal.parent.run_id, 1, SAVE_REQUEST)
                if run_id:
                    asked.append(run_id)
            return stop_when()

        return check

    def metric(self, stage: str, attempt: int, key: str) -> dict[int, float]:
        """``key`` of a stage attempt's MLflow run, step -> value."""
        runs = self._runs(stage, attempt)
        assert runs, f"no MLflow run of {stage} attempt {attempt}"
        return {m.step: m.value for m in client(self.rehearsal.config.mlflow_uri).get_metric_history(runs[0].info.run_id, key)}

    def logged(self, stage: str, attempt: int) -> set[int]:
        """The steps of a stage attempt whose metrics MLflow holds (none while its run does not exist yet)."""
        runs = self._runs(stage, attempt)
        history = client(self.rehearsal.config.mlflow_uri).get_metric_history(runs[0].info.run_id, LOGGED[stage]) if runs else []
        return {m.step for m in history}

    def run_of(self, stage: str, attempt: int):
        return self._runs(stage, attempt)[0]

    def _runs(self, stage: str, attempt: int) -> list:
        parent = self.rehearsal.parent
        return client(self.rehearsal.config.mlflow_uri).search_runs([parent.experiment_id], filter_string=naming.stage_run_filter(parent.run_id, stage, attempt))


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory, sandbox: str) -> Iterator[Done]:  # noqa: F811
    root = tmp_path_factory.mktemp("rehearsal")
    with mlflow_server(root / "mlflow") as mlflow:
        config = RehearsalConfig(out=root / "run", python=Path(sys.executable), sandbox_url=sandbox, mlflow_uri=mlflow.base_url, size=SIZE, progress=False, threads=THREADS)
        yield Done(set_up(config), {})


def test_sft_loss_falls_and_reaches_mlflow(rehearsal: Done) -> None:
    done = rehearsal.through("sft")
    first, second = done.metric("sft", 1, "train/loss"), done.metric("sft", 2, "train/loss")
    assert first[1] > 10, "a random model starts near ln(151936) = 11.9"
    final = second[max(second)]
    assert max(second) == SIZE.sft_epochs * ROWS
    assert final < 0.3, f"SFT ends at loss {final}: the tiny model did not learn the trajectories"


def test_sft_resumes_inside_the_interrupted_epoch_without_replaying_its_rows(rehearsal: Done) -> None:
    """Steps 77-80 are epoch 20; the first attempt stopped after 78's checkpoint, the second did 79 and 80."""
    done = rehearsal.through("sft")
    save = SIZE.sft_save_freq
    first_tokens, second_tokens = done.metric("sft", 1, "train/global_tokens"), done.metric("sft", 2, "train/global_tokens")
    assert min(second_tokens) == save + 1, f"the second attempt must start at step {save + 1}, started at {min(second_tokens)}"
    rows = {first_tokens[step] for step in range(1, ROWS + 1)}
    assert len(rows) == ROWS, "each row of the data has its own token count (what tells the rows apart here)"
    epoch_start = (save // ROWS) * ROWS + 1
    epoch = [first_tokens[s] for s in range(epoch_start, save + 1)] + [second_tokens[s] for s in range(save + 1, epoch_start + ROWS)]
    assert sorted(epoch) == sorted(rows), f"epoch {save // ROWS + 1} saw rows {epoch}: a row replayed or skipped across the resume"
    second_loss = done.metric("sft", 2, "train/loss")
    assert second_loss[save + 1] < 1.0, "the second attempt starts from the checkpoint's weights, not from random ones"


def rollouts(done: Done, attempt: int, step: int) -> list[dict]:
    path = Path(run_paths(done.rehearsal.run).stage_files) / f"rl-{attempt}" / ROLLOUTS_DIR / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_rl_step_one_calls_the_tool_in_the_sandbox_and_earns_reward_on_the_memorised_prompts(rehearsal: Done) -> None:
    """The actor starts from the merged SFT model: a random one never writes a parseable tool call."""
    done = rehearsal.through("rl")
    calls, successes = done.metric("rl", 1, "tool/calls"), done.metric("rl", 1, "tool/outcome_success_count")
    score = done.metric("rl", 1, "critic/score/max")
    assert calls[1] > 0 and successes[1] > 0, "step 1's code ran in the sandbox"
    assert score[1] == 1.0, "at least one rollout of step 1 got the +1 of a correct answer"
    rows = rollouts(done, 1, 1)
    assert len(rows) == SIZE.rl_batch * SIZE.rollout_n
    assert any("<tool_call>" in row["output"] and "<tool_response>" in row["output"] for row in rows)


def mixed_groups(rows: list[dict]) -> int:
    """GRPO groups (one prompt's rollouts) whose scores differ: only these have a non-zero advantage."""
    scores: dict[str, set[float]] = {}
    for row in rows:
        scores.setdefault(row["input"], set()).add(row["score"])
    return sum(len(group) > 1 for group in scores.values())


def test_rl_updates_the_actor_so_its_weights_differ_from_the_merged_sft_model(rehearsal: Done) -> None:
    """The policy gradient flows exactly where GRPO has a signal. Whether a step has one is chance: sampled at
    0.8, a memorised prompt's four rollouts all succeed, or all fail, often enough that both groups of a step
    were uniform in one run of four (advantages 0, grad_norm 0). So each step is checked against its own
    groups, read from verl's rollout dump, not against a fixed expectation."""
    done = rehearsal.through("eval")
    for attempt, step in ((1, 1), (2, 2)):
        grad = done.metric("rl", attempt, "actor/grad_norm")[step]
        mixed = mixed_groups(rollouts(done, attempt, step))
        assert (grad > 0) == (mixed > 0), f"step {step}: grad_norm {grad} with {mixed} group(s) of mixed outcomes"
    claim = Path(run_paths(done.rehearsal.run).root)
    sft, rl = load_file(claim / "models" / "sft" / "model.safetensors"), load_file(claim / "models" / "rl" / "model.safetensors")
    assert sft.keys() == rl.keys()
    changed = sum(int((sft[k] != rl[k]).sum()) for k in sft)
    assert changed > 0, "RL left every weight as the SFT model had it"


def test_rl_resume_continues_the_global_step_and_the_data(rehearsal: Done) -> None:
    done = rehearsal.through("rl")
    assert set(done.metric("rl", 2, "critic/score/mean")) == {2}, "the second attempt resumes after step 1: it runs step 2 only"
    step1, step2 = {row["input"] for row in rollouts(done, 1, 1)}, {row["input"] for row in rollouts(done, 2, 2)}
    assert len(step1) == len(step2) == SIZE.rl_batch
    assert not step1 & step2, "step 2 after the resume trained on prompts of step 1: the data loader replayed"


def test_rl_saves_at_the_step_boundary_on_the_operators_request_and_the_retry_resumes_from_it(rehearsal: Done) -> None:
    """Save on notice through verl's own save decision (``should_save_ckpt_esi`` in ``RayPPOTrainer.fit``): step 1
    has no scheduled save (saveFreq 2), so its checkpoint is the requested one, and attempt 2 resumes after it."""
    done = rehearsal.through("rl")
    first, second = done.run_of("rl", 1).data.tags, done.run_of("rl", 2).data.tags
    assert first.get(SAVE_REQUEST_TAG) == SAVE_REQUEST and first.get(SAVED_ON_NOTICE_TAG) == "1", first
    assert second.get(RESUMED_FROM_TAG) == "1" and SAVED_ON_NOTICE_TAG not in second, second
    checkpoints = Path(run_paths(done.rehearsal.run).rl_checkpoints)
    assert (checkpoints / "global_step_1").is_dir() and tracker_step(checkpoints) == 2, sorted(p.name for p in checkpoints.iterdir())


def test_eval_serves_the_merged_rl_checkpoint_and_scores_the_memorised_set(rehearsal: Done) -> None:
    done = rehearsal.through("eval")
    paths = run_paths(done.rehearsal.run)
    params = done.run_of("eval", 1).data.params
    assert params["actor_rollout_ref/model/path"] == paths.rl_merged
    rl_step = tracker_step(Path(paths.rl_checkpoints))
    assert rl_step == SIZE.rl_steps
    parent = client(done.rehearsal.config.mlflow_uri).get_run(done.rehearsal.parent.run_id).data.metrics
    key = f"final/rehearsal_mean_at_{SIZE.eval_samples}"
    assert parent.get(key, 0) > 0, f"the parent run's {key} is {parent.get(key)}: the evaluated model has not learned the memorised set"
    assert f"final/aime_demo_mean_at_{SIZE.eval_samples}" in parent


def agent_loop_prompt(done: Done, tokenizer) -> list[int]:
    """The first RL prompt as verl's tool agent loop renders it: its messages and the run's tool schema, through the chat template."""
    import pyarrow.parquet as pq
    import yaml

    paths = run_paths(done.rehearsal.run)
    messages = pq.read_table(paths.rl_train).to_pylist()[0]["prompt"]
    tools = [tool["tool_schema"] for tool in yaml.safe_load((Path(paths.stage_files) / "rl-1" / "tool_config.yaml").read_text())["tools"]]
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_the_base_model_calls_no_tool_where_the_trained_one_does(rehearsal: Done) -> None:
    """The reward > 0 above is the training's: the random base model's greedy answer to a memorised prompt is no tool call."""
    done = rehearsal.through("eval")
    claim = Path(run_paths(done.rehearsal.run).root)
    outputs = {}
    for name, directory in (("base", Path(done.rehearsal.run.spec.model.base)), ("rl", claim / "models" / "rl")):
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
        ids = torch.tensor([agent_loop_prompt(done, tokenizer)])
        out = model.generate(ids, max_new_tokens=60, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        outputs[name] = tokenizer.decode(out[0, ids.shape[1] :])
    assert "<tool_call>" not in outputs["base"]
    assert "<tool_call>" in outputs["rl"], outputs["rl"]


def test_the_demos_figures_are_the_runs_own_read_back_from_mlflow(rehearsal: Done) -> None:
    """What `make demo` prints after training (``retool.rehearsal.summary``) is what MLflow holds, over every attempt."""
    done = rehearsal.through("eval")
    summary = summarize(done.rehearsal)
    assert summary.sft_steps == SIZE.sft_epochs * ROWS and summary.sft_loss is not None
    assert summary.sft_loss[0] > 10 > 0.3 > summary.sft_loss[1]
    assert set(summary.rl) == set(range(1, SIZE.rl_steps + 1)), "both attempts' steps, merged"
    assert summary.rl[1]["tool/calls"] == done.metric("rl", 1, "tool/calls")[1]
    assert summary.scores[f"rehearsal_mean_at_{SIZE.eval_samples}"] > 0
    assert set(summary.seconds) == {"prepare", "preflight", "sft", "merge", "rl", "eval"}
    assert all(gb > 0 for gb in summary.peak_gb.values())
    text = "\n".join(summary_lines(summary))
    assert f"over {SIZE.sft_epochs * ROWS} steps" in text and "rl step 2" in text and f"rehearsal mean@{SIZE.eval_samples}" in text
