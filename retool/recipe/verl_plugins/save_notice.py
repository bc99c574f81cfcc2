"""Save on notice: the trainer saves a checkpoint at the next step boundary when the operator asks.

Why verl's own save decision is the hook: at the end of every training step ``RayPPOTrainer.fit`` asks
``should_save_ckpt_esi(...)`` whether a capacity block is about to expire, and if so saves (``if
save_freq > 0 and (is_last_step or global_steps % save_freq == 0 or esi_close_to_expiration)``), in
``ray_trainer.py`` of verl 0.6.1 and 0.9.1 alike; both import the function into ``ray_trainer``'s
namespace (``from verl.utils.checkpoint.checkpoint_manager import ... should_save_ckpt_esi``). That
is the step boundary, after the update and the validation of the step, where a checkpoint holds a
whole step. Each line's trainer binds that name to :class:`SaveOnNotice` (the one rule, here), which
returns verl's answer, or True once for each new request.

The channel is the attempt's MLflow run: the operator sets ``retool.saveRequest`` there
(``retool.tracking.request_save``) and the trainer reads its own run's tags once per step (one GET;
both sides already talk to MLflow, so no volume mount, RBAC or port is added). The trainer answers
with ``retool.savedOnNotice = <step>`` after the save and ``retool.resumedFromStep`` when an attempt
resumes. When MLflow does not answer, nothing is asked or saved, and the scheduled saves still count.
verl skips every save when ``trainer.save_freq <= 0``; so does this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from retool.recipe.verl_plugins.watch import MlflowTarget
from retool.tracking.naming import RESUMED_FROM_TAG, SAVE_REQUEST_TAG, SAVED_ON_NOTICE_TAG

logger = logging.getLogger(__name__)


class SaveOnNotice:
    """Stands for ``should_save_ckpt_esi`` in ``ray_trainer``: verl's answer, or True once per new save request."""

    def __init__(self, inner: Callable[..., bool], target: Callable[[], MlflowTarget | None] = MlflowTarget.current) -> None:
        self.inner = inner
        self.target = target
        self.handled: str | None = None
        self.pending: str | None = None

    def _request(self) -> str | None:
        try:
            found = self.target()
            if found is None:
                return None
            return found.tags().get(SAVE_REQUEST_TAG) or None
        except Exception as err:  # MLflow down: the scheduled saves still count
            logger.warning("save requests not readable from MLflow: %s", err)
            return None

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        due = bool(self.inner(*args, **kwargs))
        request = self._request()
        if request is not None and request != self.handled:
            logger.warning("saving a checkpoint at this step's end on request: %s", request)
            self.pending = request
            return True
        return due

    def saved(self, step: int) -> None:
        """After verl's ``_save_checkpoint``: answer a pending request with the checkpoint's step."""
        if self.pending is None:
            return
        self.handled, self.pending = self.pending, None
        _tag(self.target, SAVED_ON_NOTICE_TAG, str(step))

    def resumed(self, step: int) -> None:
        """After verl's ``_load_checkpoint``: the global step the attempt continues after (0: it starts afresh;
        said too, so the operator stops asking)."""
        _tag(self.target, RESUMED_FROM_TAG, str(step))


def _tag(target: Callable[[], MlflowTarget | None], key: str, value: str) -> None:
    try:
        found = target()
        if found is not None:
            found.set_tag(key, value)
    except Exception as err:  # a record of what happened; never a reason to stop training
        logger.warning("MLflow tag %s=%s not written: %s", key, value, err)


class SavesOnNotice:
    """Ahead of verl's ``RayPPOTrainer`` in each line's trainer: tells :class:`SaveOnNotice` when verl saved
    (``_save_checkpoint``) and where it resumed (``_load_checkpoint``); both methods are the same on 0.6.1 and 0.9.1."""

    save_notice: SaveOnNotice
    global_steps: int

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._save_checkpoint(*args, **kwargs)  # type: ignore[misc]
        self.save_notice.saved(int(self.global_steps))
        return result

    def _load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._load_checkpoint(*args, **kwargs)  # type: ignore[misc]
        self.save_notice.resumed(int(self.global_steps))
        return result


def install(ray_trainer_module: Any) -> SaveOnNotice:
    """Bind ``should_save_ckpt_esi`` in ``ray_trainer`` (the module global ``fit`` calls) to a :class:`SaveOnNotice`."""
    inner = ray_trainer_module.should_save_ckpt_esi
    notice = SaveOnNotice(inner.inner if isinstance(inner, SaveOnNotice) else inner)
    ray_trainer_module.should_save_ckpt_esi = notice
    return notice
