"""Guard verl's SFT resume at an epoch boundary (verl issue #7401), on both verl lines.

verl saves the train loader's state with every checkpoint: ``data.pt`` (verl 0.6.1,
``fsdp_sft_trainer.py``) or ``data_<dp rank>.pt`` (verl 0.9.1, ``CheckpointHandler.save_checkpoint``
in ``verl/utils/checkpoint/checkpoint_handler.py``, which ``sft_trainer.py``'s ``fit`` calls inside
its step loop). A checkpoint taken on
the last step of an epoch holds an exhausted loader; on resume verl restores it, sets the
sampler to the next epoch and iterates: the exhausted iterator yields nothing, so that whole
epoch is skipped, and when it was the last one the trainer exits 0 without its final step.

At an epoch boundary the loader state carries nothing worth keeping (the next epoch starts from
its first batch, in the order ``sampler.set_epoch`` gives it), so the stage resumes from a view
of the checkpoint without ``data.pt``: a directory of symlinks to every other entry, passed as
``trainer.resume_from_path``. verl then loads the model, optimizer and scheduler from it, finds no
loader state, and starts the epoch fresh. The checkpoint itself is never changed (its manifest,
the tracker and the S3 mirror stay valid).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil

from retool.runtime.sft_plan import SFTPlan
from retool.storage.steps import NoCheckpointError, latest_step

log = logging.getLogger(__name__)

LOADER_STATE = "data.pt"
"""Where verl 0.6.1's SFT trainer saves ``train_dataloader.state_dict()`` in each ``global_step_N``."""
LOADER_STATE_09 = re.compile(r"data_\d+\.pt")
"""verl 0.9.1's: one ``data_<dp rank>.pt`` per data-parallel rank (``CheckpointHandler``), restored by ``_load_dataloader_state``."""


def is_loader_state(name: str) -> bool:
    """Whether a file of a ``global_step_N`` directory is a train loader state, of either verl line."""
    return name == LOADER_STATE or LOADER_STATE_09.fullmatch(name) is not None


def boundary_step(checkpoints_dir: str, plan: SFTPlan) -> int | None:
    """The latest checkpoint's step when it sits on an epoch boundary with a loader state, else None."""
    try:
        step = latest_step(checkpoints_dir)
    except NoCheckpointError:
        return None
    if not plan.at_epoch_boundary(step):
        return None
    directory = os.path.join(checkpoints_dir, f"global_step_{step}")
    return step if any(is_loader_state(name) and os.path.isfile(os.path.join(directory, name)) for name in os.listdir(directory)) else None


def resume_view_path(view_root: str, step: int) -> str:
    """verl reads the step from the path (``global_step_N``), so the view keeps that name."""
    return posixpath.join(view_root, f"global_step_{step}")


def make_resume_view(checkpoints_dir: str, step: int, view_root: str) -> str:
    """Build the view of ``global_step_<step>`` without the loader state; returns its path."""
    source = os.path.join(checkpoints_dir, f"global_step_{step}")
    view = resume_view_path(view_root, step)
    if os.path.lexists(view):
        shutil.rmtree(view)
    os.makedirs(view)
    for entry in sorted(os.listdir(source)):
        if not is_loader_state(entry):
            os.symlink(os.path.join(source, entry), os.path.join(view, entry))
    log.info("global_step_%d ends an epoch: resuming from %s (the checkpoint without its exhausted loader state, verl issue #7401)", step, view)
    return view


def resume_overrides(view: str) -> dict[str, str]:
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": view}
