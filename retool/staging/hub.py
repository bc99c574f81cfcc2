"""Stage a Hugging Face Hub model: one resolved commit, resumable download, hub-reported hashes."""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from retool.staging.manifest import StagedFile, StagedModel
from retool.staging.plan import StagingError, StagingPlan, check_model_files, select_files
from retool.staging.verify import digests

log = logging.getLogger(__name__)

DOWNLOAD_WORKERS = 8
HASH_WORKERS = 4
HF_LOCAL_METADATA = os.path.join(".cache", "huggingface")
"""Where ``huggingface_hub`` keeps a local_dir's download state (partial ``.incomplete`` files, etags)."""


def _hub_error(plan: StagingPlan, err: Exception) -> StagingError:
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"{plan.source} on {plan.endpoint or 'the Hugging Face Hub'}"
    if isinstance(err, RevisionNotFoundError):
        return StagingError(f"model.revision {plan.revision!r} does not exist in {where}")
    if isinstance(err, GatedRepoError | RepositoryNotFoundError):
        token = "the HF_TOKEN given" if os.environ.get("HF_TOKEN") else "no token (set spec.model.tokenSecretRef to a Secret holding one)"
        return StagingError(f"cannot read {where} with {token}: the repository is missing, private or gated ({type(err).__name__})")
    return StagingError(f"downloading {where} failed: {err}")


def expected_files(info: Any) -> dict[str, Any]:
    """rfilename -> sibling (size, lfs, blob_id) of the files worth staging."""
    siblings = {s.rfilename: s for s in info.siblings or []}
    return {name: siblings[name] for name in select_files(siblings)}


def check_file(path: str, name: str, sibling: Any) -> StagedFile:
    """The file as staged, after checking it against what the hub reports; StagingError when it differs."""
    size = os.path.getsize(path)
    if sibling.size is not None and size != sibling.size:
        raise StagingError(f"{name}: {size} bytes on disk, the hub reports {sibling.size}")
    if sibling.lfs is not None:
        sha256 = digests(path)["sha256"]
        if sha256 != sibling.lfs.sha256:
            raise StagingError(f"{name}: sha256 {sha256} differs from the hub's {sibling.lfs.sha256}")
        return StagedFile(size=size, sha256=sha256)
    found = digests(path, git_blob=True)
    if sibling.blob_id and found["git_sha1"] != sibling.blob_id:
        raise StagingError(f"{name}: git blob id {found['git_sha1']} differs from the hub's {sibling.blob_id}")
    return StagedFile(size=size, sha256=found["sha256"], git_sha1=found["git_sha1"])


def _forget(destination: str, name: str) -> None:
    """Delete a file that failed its check, and huggingface_hub's record of it, so a retry downloads it again."""
    for path in (os.path.join(destination, name), os.path.join(destination, HF_LOCAL_METADATA, "download", name + ".metadata")):
        if os.path.exists(path):
            os.remove(path)


def stage_from_hub(plan: StagingPlan, *, token: str | None = None) -> StagedModel:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError
    from requests.exceptions import RequestException

    api = HfApi(endpoint=plan.endpoint, token=token)
    try:
        info = api.model_info(plan.source, revision=plan.revision, files_metadata=True)
    except (HfHubHTTPError, RequestException) as err:
        raise _hub_error(plan, err) from err
    commit = info.sha
    files = expected_files(info)
    check_model_files(files, f"{plan.source}@{commit}")
    log.info("staging %s at commit %s (%d files, %.1f GB) into %s", plan.source, commit, len(files), sum(s.size or 0 for s in files.values()) / 1e9, plan.destination)
    os.makedirs(plan.destination, exist_ok=True)
    try:
        # The commit, not the revision: a branch that moves during the download cannot mix two trees.
        snapshot_download(
            plan.source,
            revision=commit,
            local_dir=plan.destination,
            allow_patterns=sorted(files),
            endpoint=plan.endpoint,
            token=token,
            max_workers=DOWNLOAD_WORKERS,
        )
    except (HfHubHTTPError, RequestException, OSError) as err:
        raise _hub_error(plan, err) from err

    def checked(name: str) -> tuple[str, StagedFile]:
        try:
            return name, check_file(os.path.join(plan.destination, name), name, files[name])
        except StagingError:
            _forget(plan.destination, name)
            raise

    with ThreadPoolExecutor(HASH_WORKERS) as pool:
        staged = dict(pool.map(checked, sorted(files)))
    return StagedModel(kind="hub", source=plan.source, revision=plan.revision, commit=commit, files=staged)


def clear(destination: str) -> None:
    """Empty a destination that holds another model (its manifest is already gone)."""
    if os.path.isdir(destination):
        shutil.rmtree(destination)
