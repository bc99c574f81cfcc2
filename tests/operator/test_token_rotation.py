"""The operator's API client re-reads a rotated service-account token (the kubelet rotates projected
tokens; a cluster that does not extend token lifetimes rejects the old one: the API server then
answers 401), against the emulator with the old token revoked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kmock
import pytest

from retool_operator.kube import KINDS, Credentials, KubeClient, token_file_for
from tests.operator.emulator import ScalableEmulator, declare

CONFIGMAPS = KINDS[("v1", "ConfigMap")]


async def test_a_rotated_token_is_used_and_the_revoked_one_never_again(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-1\n")
    valid = {"token-1"}
    seen: list[str] = []

    def authenticate(request: Any) -> tuple[int, str] | None:
        header = request.headers.get("Authorization", "")
        seen.append(header)
        return None if header.removeprefix("Bearer ") in valid else (401, "Unauthorized")

    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        k8s.refusals = [authenticate]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="token-1", token_path=str(token_file)))
        try:
            assert await client.get(CONFIGMAPS, "ml", "absent") is None  # 404: authenticated
            # The kubelet writes a new token; the old one is revoked at once.
            token_file.write_text("token-2\n")
            os.utime(token_file, ns=(1, 10**18))  # a new mtime even on a coarse clock
            valid.clear()
            valid.add("token-2")
            assert await client.get(CONFIGMAPS, "ml", "absent") is None
            assert seen[-1] == "Bearer token-2" and "Bearer token-1" not in seen[1:]
        finally:
            await client.close()


async def test_a_401_rereads_the_token_once_even_when_the_file_looks_unchanged(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    stamp = os.stat(token_file).st_mtime_ns
    valid = {"token-1"}

    def authenticate(request: Any) -> tuple[int, str] | None:
        return None if request.headers.get("Authorization", "").removeprefix("Bearer ") in valid else (401, "Unauthorized")

    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        k8s.refusals = [authenticate]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="token-1", token_path=str(token_file)))
        try:
            assert await client.get(CONFIGMAPS, "ml", "absent") is None
            token_file.write_text("token-2")
            os.utime(token_file, ns=(stamp, stamp))  # same mtime: only the 401 tells
            valid.clear()
            valid.add("token-2")
            assert await client.get(CONFIGMAPS, "ml", "absent") is None
        finally:
            await client.close()


@pytest.mark.parametrize(("content", "expected"), [("tok", True), ("other", False)], ids=["token-from-the-file", "token-from-elsewhere"])
def test_the_token_file_is_followed_only_when_the_login_read_it(tmp_path: Path, content: str, expected: bool) -> None:
    path = tmp_path / "token"
    path.write_text(content + "\n")
    assert (token_file_for("tok", str(path)) == str(path)) is expected
