"""The MLflow container that the chart and the operator deploy, run as a real server on this machine.

Both deployments' tests start the pinned ``mlflow server`` with exactly the rendered command and
environment, only the volume (``/mlflow``), the listen address and the worker count mapped onto
this machine. Starting, waiting for ``/health`` and stopping the whole process group is
``retool.embedded.process.ManagedServer``'s job, the same code the demo and the evaluation use.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from retool.embedded.process import ManagedServer
from retool.sandbox.accounting import descendants
from tests.conftest import free_port

VOLUME = "/mlflow/"
LOCAL_VALUES = {"--host": "127.0.0.1", "--workers": "1"}


def local_command(container: dict, data: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The container's command and literal environment with ``/mlflow`` in ``data`` and the listen address here.

    Flags are accepted in both forms the deployments use (``--port=5000`` and ``--port 5000``).
    """
    command = [*container["command"], *container.get("args", [])]
    assert command[:2] == ["mlflow", "server"], command
    local = {**LOCAL_VALUES, "--port": str(port)}
    args, rest = [], command[2:]
    while rest:
        arg = rest.pop(0)
        flag, equals, _ = arg.partition("=")
        if flag in local:
            if not equals:
                rest.pop(0)
            arg = f"{flag}={local.pop(flag)}"
        args.append(arg.replace(VOLUME, f"{data}/"))
    args += [f"{flag}={value}" for flag, value in local.items()]
    env = {e["name"]: e["value"].replace(VOLUME, f"{data}/") for e in container.get("env", []) if "value" in e}
    env["HOME"] = str(data)
    return [sys.executable, "-m", "mlflow", "server", *args], env


def deployed_mlflow(container: dict, data: Path, *, start_timeout_s: float = 180.0) -> ManagedServer:
    """A server (not yet started; use it as a context manager) running ``container``'s command on ``data``."""
    port = free_port()
    argv, env = local_command(container, data, port)
    url, log = f"http://127.0.0.1:{port}", data / "server.log"
    return ManagedServer(name="mlflow", argv=argv, base_url=url, ready_path="/health", log_path=log, env={**os.environ, **env}, cwd=data, start_timeout_s=start_timeout_s)


def job_runner_processes(server: ManagedServer) -> list[str]:
    """Command lines of MLflow's GenAI job runner and its huey consumers under ``server``.

    ``mlflow server`` (3.17.2, ``mlflow/server/__init__.py``) starts ``mlflow.server.jobs._job_runner``
    right after it spawns the HTTP server, so once ``/health`` answers the runner is there if job
    execution is on; the runner then starts the huey consumers.
    """
    assert server.pid is not None
    commands = []
    for pid in descendants(server.pid):
        try:
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # ended meanwhile
            continue
    return [c for c in commands if "mlflow.server.jobs" in c or "huey" in c]
