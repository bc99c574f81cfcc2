"""The two embedded servers: our code sandbox and an MLflow tracking server.

Both bind 127.0.0.1 on a free port and run this interpreter (``sys.executable -m ...``), so the
demo and the tests use exactly the code and packages of the environment they run in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from retool.embedded.process import ManagedServer, free_port

HOST = "127.0.0.1"


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with the directory holding the ``retool`` package first on PYTHONPATH."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def sandbox_server(log_dir: Path, *, port: int | None = None, workers: int = 2, start_timeout_s: float = 120.0, env: Mapping[str, str] | None = None) -> ManagedServer:
    """Our sandbox (``python -m retool.sandbox``), ready when ``/readyz`` answers 200; ``env`` adds its settings (``RETOOL_SANDBOX_*``)."""
    port = port or free_port(HOST)
    return ManagedServer(
        name="sandbox",
        argv=[sys.executable, "-m", "retool.sandbox", "--host", HOST, "--port", str(port), "--workers", str(workers)],
        base_url=f"http://{HOST}:{port}",
        ready_path="/readyz",
        log_path=log_dir / "sandbox.log",
        env=_child_env(env),
        start_timeout_s=start_timeout_s,
    )


def mlflow_server(root: Path, *, port: int | None = None, start_timeout_s: float = 180.0) -> ManagedServer:
    """An MLflow tracking server with a sqlite backend and artifacts proxied into ``root/artifacts``.

    ``--serve-artifacts`` (MLflow's default) makes clients upload artifacts through the server,
    so a client never needs to see the artifact directory: the same as a cluster deployment.
    """
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port(HOST)
    argv = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", HOST,
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    return ManagedServer(
        name="mlflow",
        argv=argv,
        base_url=f"http://{HOST}:{port}",
        ready_path="/health",
        log_path=root / "mlflow.log",
        # No job runner (a second process that only serves MLflow's GenAI jobs): one less thing
        # competing for a laptop's cores, and nothing the demo or an evaluation uses.
        env=_child_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}),
        cwd=root,
        start_timeout_s=start_timeout_s,
    )
