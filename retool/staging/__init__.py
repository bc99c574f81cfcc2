"""Model staging: the base model copied once onto the run's PVC, verified, before any trainer runs.

Without it every stage pod downloads the base model (about 65 GB for 32B) into its container
layer, per pod and per retry, and neither an ``s3://`` base nor ``model.revision`` reaches verl.
The prepare stage runs ``python -m retool.staging --spec RUN.yaml``:

- a hub id (``org/name``, optional ``model.revision``, a token from the ``HF_TOKEN`` the operator
  sets from ``model.tokenSecretRef``, a mirror from ``model.hubEndpoint``) is resolved to one
  commit and downloaded with ``huggingface_hub`` into ``models/base`` (resumable: an interrupted
  file continues from its partial bytes), then every file is checked against the size and hash
  the hub reports (LFS sha256, else the git blob id);
- an ``s3://`` prefix is copied object by object (each verified by size, its ``sha256`` metadata
  when present and its MD5 ETag when single-part; a retool-uploaded prefix with a manifest goes
  through ``retool.storage.download_dir``);
- a PVC path is used in place, after checking it holds a model.

The manifest (``STAGED_MANIFEST``) is written last: a directory without it is not a staged model,
and a retry with the same source finds it and does nothing. Every later stage's command reads
``retool.runtime.paths.staged_model_path(run)``.
"""

from retool.staging.manifest import STAGED_MANIFEST, StagedModel, read_staged
from retool.staging.plan import StagingError, StagingPlan, staging_plan
from retool.staging.run import stage_model

__all__ = ["STAGED_MANIFEST", "StagedModel", "StagingError", "StagingPlan", "read_staged", "stage_model", "staging_plan"]
