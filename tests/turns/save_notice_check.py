"""Save on notice, the trainer's side, on each verl line's own ``ray_trainer`` (tests/turns and tests/verl09 call it).

verl's ``RayPPOTrainer.fit`` decides at each step's end whether to save with ``should_save_ckpt_esi(...)``, a
name ``ray_trainer`` imports; the check reads that from verl's own source, binds the name as each line's
trainer does (``save_notice.install``), and runs the decision against a real MLflow run carrying the
operator's request, as the trainer's process would at successive step ends.
"""

from __future__ import annotations

import inspect
import uuid
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from retool.recipe.verl_plugins import save_notice
from retool.recipe.verl_plugins.watch import MlflowTarget
from retool.tracking.naming import RESUMED_FROM_TAG, SAVE_REQUEST_TAG, SAVED_ON_NOTICE_TAG


def check_saves_once_per_request_at_verls_own_decision(ray_trainer: Any, tmp_path: Path, trainer_class: type) -> None:
    # The line's trainer hears of verl's own save and load: the mixin's methods, verl's underneath.
    assert trainer_class._save_checkpoint is save_notice.SavesOnNotice._save_checkpoint
    assert trainer_class._load_checkpoint is save_notice.SavesOnNotice._load_checkpoint
    mro = trainer_class.__mro__
    assert mro.index(save_notice.SavesOnNotice) < mro.index(ray_trainer.RayPPOTrainer) and "_save_checkpoint" in vars(ray_trainer.RayPPOTrainer)
    fit = inspect.getsource(ray_trainer.RayPPOTrainer.fit)
    assert "should_save_ckpt_esi(" in fit and "self._save_checkpoint()" in fit, "verl's fit no longer asks should_save_ckpt_esi before its save"
    assert fit.index("should_save_ckpt_esi(") < fit.rindex("self._save_checkpoint()")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment(f"notice-{uuid.uuid4().hex[:8]}")).info.run_id
    original = ray_trainer.should_save_ckpt_esi
    try:
        notice = save_notice.install(ray_trainer)
        # verl's own function underneath, also where an earlier trainer of this process bound the name already
        verls = original.inner if isinstance(original, save_notice.SaveOnNotice) else original
        assert ray_trainer.should_save_ckpt_esi is notice and notice.inner is verls and verls.__module__ == "verl.utils.checkpoint.checkpoint_manager"
        notice.target = lambda: MlflowTarget(uri, run_id)
        decide = ray_trainer.should_save_ckpt_esi
        assert decide(max_steps_duration=30.0, redundant_time=0) is False, "no request, no capacity block: verl's own answer"
        client.set_tag(run_id, SAVE_REQUEST_TAG, "node gpu-7 is going: it is cordoned (spec.unschedulable)")
        assert decide(max_steps_duration=30.0, redundant_time=0) is True
        assert decide(max_steps_duration=30.0, redundant_time=0) is True, "asked again until verl saved (save_freq <= 0 saves nothing)"
        notice.saved(3)
        assert client.get_run(run_id).data.tags[SAVED_ON_NOTICE_TAG] == "3"
        assert decide(max_steps_duration=30.0, redundant_time=0) is False, "one save per request"
        notice.saved(4)  # a scheduled save after it answers nothing
        assert client.get_run(run_id).data.tags[SAVED_ON_NOTICE_TAG] == "3"
        client.set_tag(run_id, SAVE_REQUEST_TAG, "node gpu-9 is going: Karpenter is disrupting it (taint karpenter.sh/disrupted)")
        assert decide(max_steps_duration=30.0, redundant_time=0) is True, "a new request saves again"
        notice.resumed(0)
        assert client.get_run(run_id).data.tags[RESUMED_FROM_TAG] == "0", "a fresh start says so (the operator stops asking)"
        notice.resumed(5)
        assert client.get_run(run_id).data.tags[RESUMED_FROM_TAG] == "5"
        notice.target = lambda: MlflowTarget("http://127.0.0.1:9", run_id)  # MLflow gone: verl's own answer, no error
        assert decide(max_steps_duration=30.0, redundant_time=0) is False
    finally:
        ray_trainer.should_save_ckpt_esi = original
