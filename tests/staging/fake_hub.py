"""A local Hugging Face Hub on 127.0.0.1 that speaks what ``huggingface_hub.snapshot_download`` uses.

The endpoints and headers follow huggingface_hub 0.36's client code (``HfApi.model_info`` and
``file_download.get_hf_file_metadata`` / ``http_get``) and the hub's documented behaviour:

- ``GET /api/models/{repo}[/revision/{rev}]`` (``?blobs=true`` adds size, blobId, lfs) -> model info
  with the commit ``sha`` the revision resolves to;
- ``HEAD|GET /{repo}/resolve/{rev}/{file}``: small files are served directly with their git blob
  id as ETag; LFS files answer with a 302 to an absolute LFS URL, ``X-Linked-Etag`` (the sha256)
  and ``X-Linked-Size``; every answer carries ``X-Repo-Commit``;
- byte ranges (``Range: bytes=N-``, 206) so interrupted downloads resume;
- gated repositories answer 401 with ``X-Error-Code: GatedRepo`` unless the request carries the
  token; unknown revisions 404 with ``X-Error-Code: RevisionNotFound``.

Faults for tests: ``cut(file, nbytes)`` sends the first bytes of a file then drops the connection
and fails every later request for it until ``heal()``; ``corrupt(file)`` serves wrong bytes of the
right length.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 1024
"""Files at least this large (and every *.safetensors) are stored in LFS, as the hub does for weights."""


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    token: str | None = None
    """When set, the repository is gated: files need ``Authorization: Bearer <token>``."""
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name])
        return digest.hexdigest()

    def is_lfs(self, name: str) -> bool:
        return name.endswith(".safetensors") or len(self.files[name]) >= LFS_THRESHOLD

    def resolve(self, revision: str) -> str | None:
        if revision in ("main", self.commit):
            return self.commit
        return self.commit if revision in self.tags else None

    def sibling(self, name: str, blobs: bool) -> dict:
        if not blobs:
            return {"rfilename": name}
        data = self.files[name]
        entry: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


class FakeHub:
    def __init__(self, *repos: FakeRepo) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.requests: list[tuple[str, str, str | None]] = []
        self.downloads: list[tuple[str, str | None]] = []
        """(file, Range header) of every GET that served a file's bytes."""
        self._cuts: dict[str, int] = {}
        self._broken: set[str] = set()
        self._corrupt: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def cut(self, name: str, nbytes: int) -> None:
        self._cuts[name] = nbytes

    def corrupt(self, name: str) -> None:
        self._corrupt.add(name)

    def heal(self) -> None:
        self._cuts.clear()
        self._broken.clear()
        self._corrupt.clear()
        self.requests.clear()
        self.downloads.clear()

    def ranges(self, name: str) -> list[str | None]:
        """The Range header of every GET of ``name``'s bytes (None: from the start)."""
        return [rng for served, rng in self.downloads if served == name]

    # ------------------------------------------------------------------ HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(head=True)

            def do_GET(self) -> None:
                self._route(head=False)

            def _send(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head and body:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, message: str, head: bool) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(status, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, body, head)

            def _route(self, head: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                with hub._lock:
                    hub.requests.append(("HEAD" if head else "GET", path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    return self._model_info(parts[2:], parse_qs(url.query), head)
                if parts[0] == "lfs":
                    return self._lfs(parts[1], head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
                return self._error(404, "EntryNotFound", f"no route {path}", head)

            def _repo(self, repo_id: str, head: bool) -> FakeRepo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(401, "RepoNotFound", "Repository not found", head)
                return repo

            def _model_info(self, parts: list[str], query: dict, head: bool) -> None:
                repo_id = "/".join(parts[:2])
                repo = self._repo(repo_id, head)
                if repo is None:
                    return
                revision = "main" if len(parts) < 4 else parts[3]
                commit = repo.resolve(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                info = {
                    "_id": repo.commit[:24],
                    "id": repo.repo_id,
                    "modelId": repo.repo_id,
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if repo.token else False,
                    "disabled": False,
                    "tags": ["transformers"],
                    "library_name": "transformers",
                    "siblings": [repo.sibling(name, blobs) for name in sorted(repo.files)],
                }
                self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), head)

            def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
                repo = self._repo(repo_id, head)
                if repo is None:
                    return
                commit = repo.resolve(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                if name not in repo.files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist", head)
                if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    return self._error(401, "GatedRepo", "Access to this model is restricted: you must be authenticated", head)
                data = repo.files[name]
                common = {"X-Repo-Commit": commit}
                if repo.is_lfs(name):
                    sha = hashlib.sha256(data).hexdigest()
                    hub._lfs_names = {**getattr(hub, "_lfs_names", {}), sha: (repo, name)}
                    headers = {**common, "Location": f"{hub.url}/lfs/{sha}", "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_id(data)}"'}
                    return self._send(302, headers, b"", head)
                return self._body(name, data, {**common, "ETag": f'"{git_blob_id(data)}"'}, head)

            def _lfs(self, sha: str, head: bool) -> None:
                found = getattr(hub, "_lfs_names", {}).get(sha)
                if found is None:
                    return self._error(404, "EntryNotFound", "no such LFS object", head)
                repo, name = found
                self._body(name, repo.files[name], {"ETag": f'"{sha}"'}, head)

            def _body(self, name: str, data: bytes, headers: dict[str, str], head: bool) -> None:
                if name in hub._broken:
                    return self._error(500, "Internal", "storage unavailable", head)
                if name in hub._corrupt:
                    data = bytes(b ^ 0xFF for b in data)
                start = 0
                rng = self.headers.get("Range")
                status = 200
                if rng and rng.startswith("bytes="):
                    start = int(rng[len("bytes=") :].split("-", 1)[0])
                    status = 206
                    headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                body = data[start:]
                if not head:
                    with hub._lock:
                        hub.downloads.append((name, rng))
                if head:
                    return self._send(200, {**headers, "Content-Length": str(len(data))}, b"", True)
                cut = hub._cuts.get(name)
                if cut is not None and not head:
                    hub._broken.add(name)
                    self.send_response(status)
                    for key, value in {**headers, "Content-Length": str(len(body))}.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                self._send(status, {**headers, "Content-Length": str(len(body))}, body, False)

        return Handler
