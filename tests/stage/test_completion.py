"""A stage counts as succeeded only when it did its work: the checks run after a command exits 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.runtime import completion
from retool.runtime.paths import run_paths
from retool.runtime.sft_plan import sft_plan
from retool.spec.validate import parse_run
from tests.render.cases import load_example


def make_run(tmp_path: Path):
    doc = load_example("minimal")
    doc["spec"].setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(tmp_path)
    doc["spec"].setdefault("rl", {})["steps"] = 40
    return parse_run(doc)


def checkpoints(directory: str, steps: list[int], tracker: int | None, subdir: str = "") -> None:
    for step in steps:
        shard = Path(directory, f"global_step_{step}", subdir)
        shard.mkdir(parents=True)
        (shard / "model_world_size_8_rank_0.pt").write_bytes(b"x")
    if tracker is not None:
        Path(directory, "latest_checkpointed_iteration.txt").write_text(str(tracker))


def eval_dump(path: str, sources: dict[str, int]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"input": f"{source} problem {p}", "output": "...", "score": 1.0 if s % 2 else -1.0, "acc": bool(s % 2), "pred": str(s), "data_source": source}
        for source, problems in sources.items()
        for p in range(problems)
        for s in range(30)
    ]
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("steps", "tracker", "reason"),
    [
        pytest.param([30, 40], 40, None, id="final-step-checkpointed-is-success"),
        pytest.param([30], 30, "final checkpoint is global_step_30, not global_step_40", id="stopped-early-fails"),
        pytest.param([], None, "left no checkpoint", id="no-checkpoint-fails"),
        pytest.param([30, 40], 30, "global_step_30, not global_step_40", id="tracker-behind-the-directories-counts-as-the-tracker-says"),
    ],
)
def test_rl_succeeds_only_on_its_planned_last_step(tmp_path: Path, steps: list[int], tracker: int | None, reason: str | None) -> None:
    run = make_run(tmp_path)
    Path(run_paths(run).rl_checkpoints).mkdir(parents=True)
    checkpoints(run_paths(run).rl_checkpoints, steps, tracker, "actor")
    unmet = completion.unmet(completion.expectation(run, "rl"))
    assert unmet == reason if reason is None else reason in unmet


def test_sft_planned_total_comes_from_the_data_as_verl_counts_it(tmp_path: Path) -> None:
    run = make_run(tmp_path)  # 8 devices, sequenceParallel 4: 2 data-parallel ranks of 16 trajectories
    plan = sft_plan(run.spec, 2003)  # floor(floor(2003 / 2) / 16) = 62 steps x 6 epochs
    assert (plan.steps_per_epoch, plan.total_steps) == (62, 372)
    Path(run_paths(run).sft_checkpoints).mkdir(parents=True)
    checkpoints(run_paths(run).sft_checkpoints, [310], 310)
    assert "global_step_310, not global_step_372" in completion.unmet(completion.expectation(run, "sft", plan))


@pytest.mark.parametrize(
    ("sources", "reason"),
    [
        pytest.param({"aime_2024": 3, "aime_2025": 3}, None, id="every-set-scored"),
        pytest.param({"aime_2024": 3}, "has no mean@30 for aime_2025 (scored: aime_2024)", id="a-set-missing-fails"),
        pytest.param({}, "wrote no per-sample results", id="no-dump-fails"),
    ],
)
def test_eval_succeeds_only_when_every_requested_set_has_scores(tmp_path: Path, sources: dict[str, int], reason: str | None) -> None:
    run = make_run(tmp_path)
    expected = completion.expectation(run, "eval")
    assert expected.eval_sets == ("aime_2024", "aime_2025")
    if sources:
        eval_dump(expected.eval_dump, sources)
    unmet = completion.unmet(expected)
    assert unmet == reason if reason is None else reason in unmet


def test_prepare_and_merge_have_no_count_to_check(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    assert completion.unmet(completion.expectation(run, "prepare")) is None
