"""Sandbox configuration: one pydantic-settings object, environment prefix ``RETOOL_SANDBOX_``.

The CLI flags (--host, --port, --workers) override the environment; everything else is tuned
through the environment so the operator can set it on the Deployment.
"""

from __future__ import annotations

import os
import tempfile
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from retool.spec.names import SANDBOX_PORT

DEFAULT_PRELOAD: tuple[str, ...] = (
    "math", "cmath", "itertools", "functools", "fractions", "decimal", "collections", "heapq", "bisect",
    "random", "statistics", "re", "string", "json", "datetime", "time", "operator", "copy", "typing",
    "dataclasses", "numbers", "array", "struct", "hashlib", "ctypes", "subprocess", "signal", "threading",
    "io", "textwrap", "pprint", "traceback", "multiprocessing", "glob", "pathlib", "socket", "encodings.idna",
    "csv", "base64", "unicodedata", "tempfile", "shutil", "secrets", "contextlib", "enum", "warnings", "inspect",
    "ast", "resource", "gc", "queue", "timeit", "sys", "os",
    "numpy", "numpy.linalg", "sympy", "scipy", "scipy.linalg", "scipy.optimize", "scipy.special",
    "scipy.integrate",
)  # fmt: skip
"""Modules imported once into the template, so executions get them for the cost of a fork."""


class SandboxSettings(BaseSettings):
    """Every knob of a sandbox replica."""

    model_config = SettingsConfigDict(env_prefix="RETOOL_SANDBOX_", extra="ignore")

    host: str = Field("127.0.0.1", description="Bind address; 0.0.0.0 in a pod.")
    port: int = Field(SANDBOX_PORT, ge=1, le=65535)
    workers: int = Field(16, ge=1, le=512, description="Concurrent executions of this replica (warm worker processes).")
    queue_size: int | None = Field(None, ge=0, description="Requests allowed to wait for a worker; beyond that 429. Default: 4 x workers.")
    retry_after_s: int = Field(1, ge=1, description="Retry-After sent with 429.")
    default_memory_limit_mb: int = Field(1024, ge=16)
    max_memory_limit_mb: int = Field(8192, ge=16)
    max_run_timeout_s: float = Field(300.0, gt=0)
    output_limit_bytes: int = Field(1 << 20, ge=1024, description="Cap of stdout and of stderr each; the rest is dropped with a marker.")
    max_processes: int = Field(64, ge=1, description="RLIMIT_NPROC of an execution (processes and threads).")
    max_file_size_mb: int = Field(64, ge=1, description="RLIMIT_FSIZE of an execution.")
    max_open_files: int = Field(256, ge=16, description="RLIMIT_NOFILE of an execution.")
    tmp_size_mb: int = Field(256, ge=1, description="Scratch quota of one execution: the size of its private /tmp with mount namespaces, else the most its directory may hold.")
    max_scratch_files: int = Field(10000, ge=16, description="Files and directories one execution may create in its scratch space.")
    max_fetch_bytes: int = Field(16 << 20, ge=0, description="Total size of files returned by fetch_files.")
    namespaces: Literal["auto", "off"] = Field("auto", description="auto: pid, network and mount namespaces per worker where the kernel and privileges allow; off: never.")
    landlock_max_abi: int | None = Field(None, ge=0, description="Use Landlock up to this ABI (0: not at all); default: all the kernel has. Emulates older kernels.")
    seccomp: bool = Field(True, description="Install the execution seccomp filter (signals, ptrace, sockets, namespaces).")
    native_setup: bool = Field(
        True,
        description="Make each execution's setup (detach, descriptors, credentials, Landlock, seccomp) in one call of the compiled helper where it was built"
        " (retool/sandbox/_settle.c); false, or no helper: the same calls from Python, ~1 ms more CPU per request. /readyz: isolation.execution_setup.",
    )
    cgroups: Literal["auto", "off"] = Field(
        "auto", description="auto: a memory and pids cgroup per execution where the replica can write its cgroup subtree (not inside a user namespace); off: never."
    )
    cgroup_failure: Literal["refuse", "run"] = Field(
        "refuse",
        description=(
            "When an execution's cgroup cannot be made on a replica that has the layer: refuse the execution (SandboxError)"
            " or run it with the memory watch only. Counted either way (/readyz, /metrics)."
        ),
    )
    require_isolation: bool = Field(False, description="Strict: stay not-ready (and refuse executions) unless the isolation is strong (spec.sandbox.isolation: strict).")
    runtime_class: str | None = Field(None, description="RuntimeClass the pod runs under (gVisor, Kata), reported in /readyz.")
    uid_base: int = Field(60000, ge=1, description="When started with the privilege to, execution slot i runs as uid/gid uid_base + i.")
    tmp_root: str = Field(default_factory=tempfile.gettempdir, description="Where per-execution directories live without a private /tmp.")
    preload: tuple[str, ...] = Field(DEFAULT_PRELOAD, description="Modules imported into the warm template.")
    pass_env: tuple[str, ...] = Field(("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH"), description="Server variables the template keeps; all others are dropped.")
    worker_start_timeout_s: float = Field(120.0, gt=0)
    max_body_bytes: int = Field(32 << 20, ge=1024, description="Largest request body; a bigger one is answered 413 before it is read.")
    header_timeout_s: float = Field(10.0, gt=0, description="Time a client has to send a request's headers.")
    body_timeout_s: float = Field(30.0, gt=0, description="Time a client has to send a request's body once its headers are in.")
    idle_timeout_s: float = Field(15.0, gt=0, description="An open connection with no request in progress is closed after this long.")
    max_connections: int = Field(
        512, ge=1, description="Open (not closing) HTTP connections; beyond that the oldest with no request being handled is closed (refused only when none is)."
    )
    write_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time an answer's bytes may wait for the client to read them (from the write that filled the transport, or from the close) before the connection is aborted.",
    )
    handler_timeout_s: float = Field(
        10.0, gt=0, description="Time a request the pool does not bound (anything but POST /run_code) may take before it is answered 503 (aborted once its answer has started)."
    )
    max_unsent_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="Answer bytes waiting for slow readers across all connections; past it the connections that have waited longest are aborted.",
    )
    max_inflight_body_bytes: int = Field(
        64 << 20, ge=1024, description="Request body bytes held across all connections at once, counted as they arrive; a body whose bytes do not fit is a 503."
    )
    max_body_json_tokens: int = Field(
        250_000,
        ge=1000,
        description="JSON values a request body may open (its '[', '{', '\"' and ',' bytes, strings included); more is answered 413 before the body is parsed.",
    )
    max_request_files: int = Field(1000, ge=0, description="Entries of a request's files; more is answered 413.")
    liveness_no_worker_s: float = Field(
        60.0, gt=0, description="/healthz fails once the replica has had no live worker this long (workers keep failing to start): Kubernetes restarts it."
    )
    drain_timeout_s: float = Field(20.0, ge=0, description="On SIGTERM: stop accepting, let running requests finish this long, then stop.")
    pod_name: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or "local")

    @property
    def effective_queue_size(self) -> int:
        return self.queue_size if self.queue_size is not None else 4 * self.workers
