"""Save on notice through verl 0.9.1's own save decision (tests/turns/save_notice_check.py; the 0.6 line: tests/turns)."""

from __future__ import annotations

from pathlib import Path

from verl.trainer.ppo import ray_trainer

from retool.recipe.verl_plugins.v0_9.trainer import RetoolPPOTrainer
from tests.turns.save_notice_check import check_saves_once_per_request_at_verls_own_decision


def test_the_trainer_saves_once_per_operator_request_at_verls_step_end_decision(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    check_saves_once_per_request_at_verls_own_decision(ray_trainer, tmp_path, RetoolPPOTrainer)
