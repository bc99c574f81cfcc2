"""Latest-checkpoint resolution on directory trees laid out the way verl writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.storage.steps import TRACKER_FILE, NoCheckpointError, latest_step


def make_tree(root: Path, steps: dict[int, list[str]], tracker: str | None) -> Path:
    """``steps``: step -> files inside global_step_N (paths may include a sub-directory)."""
    root.mkdir(parents=True, exist_ok=True)
    for step, files in steps.items():
        base = root / f"global_step_{step}"
        base.mkdir()
        for name in files:
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_text("x")
    if tracker is not None:
        (root / TRACKER_FILE).write_text(tracker)
    return root


SFT_SHARD = ["model_world_size_8_rank_0.pt", "huggingface/config.json"]
RL_SHARD = ["actor/model_world_size_8_rank_0.pt", "actor/huggingface/config.json"]


@pytest.mark.parametrize(
    ("steps", "tracker", "subdir", "expected"),
    [
        pytest.param({62: SFT_SHARD, 124: SFT_SHARD, 372: SFT_SHARD}, "372", "", 372, id="sft-tracker-names-the-last"),
        pytest.param({30: RL_SHARD, 60: RL_SHARD}, "60\n", "actor", 60, id="rl-tracker-with-newline"),
        pytest.param({30: RL_SHARD, 60: RL_SHARD, 90: []}, "60", "actor", 60, id="tracker-wins-over-a-newer-half-written-dir"),
        pytest.param({30: RL_SHARD, 60: RL_SHARD}, None, "actor", 60, id="no-tracker-newest-complete-dir"),
        pytest.param({30: RL_SHARD, 60: ["data.pt"]}, None, "actor", 30, id="no-tracker-skips-dir-without-actor"),
        pytest.param({30: RL_SHARD, 60: RL_SHARD}, "90", "actor", 60, id="tracker-points-nowhere-falls-back"),
        pytest.param({9: SFT_SHARD, 10: SFT_SHARD}, "garbage", "", 10, id="unreadable-tracker-falls-back-numerically"),
    ],
)
def test_latest_step(tmp_path: Path, steps: dict[int, list[str]], tracker: str | None, subdir: str, expected: int) -> None:
    root = make_tree(tmp_path / "checkpoints", steps, tracker)
    assert latest_step(root, subdir) == expected


@pytest.mark.parametrize(
    ("steps", "tracker", "match"),
    [
        pytest.param({}, None, "no complete checkpoint", id="empty-dir"),
        pytest.param({30: []}, "30", "no complete checkpoint", id="only-empty-step-dirs"),
    ],
)
def test_no_checkpoint_is_a_clear_error(tmp_path: Path, steps: dict[int, list[str]], tracker: str | None, match: str) -> None:
    root = make_tree(tmp_path / "checkpoints", steps, tracker)
    with pytest.raises(NoCheckpointError, match=match):
        latest_step(root, "actor")


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoCheckpointError, match="has not saved any"):
        latest_step(tmp_path / "nowhere")
