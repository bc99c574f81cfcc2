"""Stage a model from an ``s3://`` prefix: object by object, each verified before it takes its name."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from retool.staging.manifest import StagedFile, StagedModel
from retool.staging.plan import StagingError, StagingPlan, check_model_files, select_files
from retool.staging.verify import digests, single_part_md5

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".retool-partial"
SHA256_METADATA = "sha256"
"""Object metadata (x-amz-meta-sha256) that retool's uploads carry."""
WORKERS = 4


@dataclass(frozen=True)
class RemoteObject:
    key: str
    name: str
    size: int
    etag: str | None


def list_objects(client: Any, bucket: str, prefix: str) -> list[RemoteObject]:
    list_prefix = f"{prefix}/" if prefix else ""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=list_prefix):
        for obj in page.get("Contents", []):
            name = obj["Key"][len(list_prefix) :]
            if name and not name.endswith("/"):
                found.append(RemoteObject(obj["Key"], name, int(obj["Size"]), obj.get("ETag")))
    return found


def check_object(path: str, obj: RemoteObject, sha256: str | None) -> StagedFile:
    """The local copy of ``obj`` after checking its size, its sha256 metadata and its single-part MD5 ETag."""
    size = os.path.getsize(path)
    if size != obj.size:
        raise StagingError(f"{obj.name}: {size} bytes on disk, S3 reports {obj.size}")
    md5 = single_part_md5(obj.etag)
    found = digests(path, md5=md5 is not None)
    if sha256 and found["sha256"] != sha256:
        raise StagingError(f"{obj.name}: sha256 {found['sha256']} differs from the object's sha256 metadata {sha256}")
    if md5 and found["md5"] != md5:
        raise StagingError(f"{obj.name}: MD5 {found['md5']} differs from the object's ETag {md5}")
    if not sha256 and not md5:
        log.warning("%s: S3 reports no content hash (multipart upload without sha256 metadata); checked by size only", obj.name)
    return StagedFile(size=size, sha256=found["sha256"])


def stage_from_s3(plan: StagingPlan, *, client: Any = None) -> StagedModel:
    from botocore.exceptions import BotoCoreError, ClientError

    from retool.storage import MANIFEST_NAME, S3Location, make_client, parse_location

    location = parse_location(plan.source)
    assert isinstance(location, S3Location)
    client = client or make_client(endpoint_url=plan.endpoint, region=plan.region)
    try:
        objects = {o.name: o for o in list_objects(client, location.bucket, location.prefix) if o.name != MANIFEST_NAME}
    except (BotoCoreError, ClientError) as err:
        raise StagingError(f"cannot list {plan.source}: {err}") from err
    if not objects:
        raise StagingError(f"{plan.source} holds no objects")
    wanted = select_files(objects)
    check_model_files(wanted, plan.source)
    os.makedirs(plan.destination, exist_ok=True)
    log.info("staging %s (%d objects, %.1f GB) into %s", plan.source, len(wanted), sum(objects[n].size for n in wanted) / 1e9, plan.destination)

    def copy(name: str) -> tuple[str, StagedFile]:
        obj = objects[name]
        final = os.path.join(plan.destination, name)
        try:
            head = client.head_object(Bucket=location.bucket, Key=obj.key)
            sha256 = (head.get("Metadata") or {}).get(SHA256_METADATA)
            if os.path.isfile(final) and os.path.getsize(final) == obj.size:
                try:
                    return name, check_object(final, obj, sha256)  # copied by an earlier attempt
                except StagingError:
                    os.remove(final)
            partial = final + PARTIAL_SUFFIX
            os.makedirs(os.path.dirname(final), exist_ok=True)
            client.download_file(location.bucket, obj.key, partial)
            entry = check_object(partial, obj, sha256)
        except (BotoCoreError, ClientError) as err:
            raise StagingError(f"copying {obj.key} from {plan.source} failed: {err}") from err
        except StagingError:
            if os.path.exists(final + PARTIAL_SUFFIX):
                os.remove(final + PARTIAL_SUFFIX)
            raise
        os.replace(partial, final)
        return name, entry

    with ThreadPoolExecutor(WORKERS) as pool:
        staged = dict(pool.map(copy, wanted))
    return StagedModel(kind="s3", source=plan.source, revision=None, commit=None, files=staged)
