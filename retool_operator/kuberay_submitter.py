"""The shell script KubeRay's submitter Job runs for a RayJob in ``K8sJobMode`` (our own port).

KubeRay builds this script itself when the submitter container has no ``command`` (ours has none,
``builders/stages.py``), so what runs in the trainer image is decided by KubeRay, not by us. This
module rebuilds it from a rendered RayJob so that tests can run the very script against a local
Ray head and check that the image provides every program it calls (``retool.runtime.image_contract``).

Upstream, read for this port (not copied):

- KubeRay v1.7.0, ``ray-operator/controllers/ray/common/job.go`` ``BuildJobSubmitCommand``: in
  every submission mode the script starts with a loop ``until <python health check> ; do echo
  ...; sleep 2; done`` against ``<dashboard>/api/gcs_healthz``; before 1.7 (v1.6.1, same file)
  the loop was SidecarMode-only and K8sJobMode went straight to ``ray job status``.
- ``ray-operator/controllers/ray/utils/constant.go`` (v1.7.0): ``BasePythonHealthCommand`` =
  ``python -c "import urllib.request; r=urllib.request.urlopen('<url>', timeout=<s>); exit(0 if
  b'success' in r.read() else 1)"``, ``RayDashboardGCSHealthPath`` = ``api/gcs_healthz``,
  ``RayDashboardGCSHealthCheckTimeoutSeconds`` = 10. In v1.6.1 the same constant took a port and
  a path on ``localhost`` and a timeout of ``DefaultReadinessProbeFailureThreshold``.
- ``ray-operator/controllers/ray/rayjob_controller.go`` ``configureSubmitterContainer`` (v1.7.0,
  v1.6.1): the container command is ``utils.GetContainerCommand(["e"])`` = ``/bin/bash -ce --``
  (``-l`` is added only when the operator's ``ENABLE_LOGIN_SHELL`` is true, off by default;
  ``utils/util.go``) and the single argument is the script's words joined by spaces; the
  environment gets ``PYTHONUNBUFFERED=1``, ``RAY_DASHBOARD_ADDRESS`` and ``RAY_JOB_SUBMISSION_ID``.

The project pins KubeRay v1.6.1 (``upstream/versions.env``: the Go module proxy refuses 1.7.0),
but clusters run 1.7, so both builds are here, selected by ``version``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

KUBERAY_1_7 = (1, 7)
DASHBOARD_GCS_HEALTH_PATH = "api/gcs_healthz"
GCS_HEALTH_TIMEOUT_SECONDS = 10
"""``RayDashboardGCSHealthCheckTimeoutSeconds`` (v1.7.0)."""
SUBMITTER_SHELL = ("/bin/bash", "-ce", "--")
"""``GetContainerCommand(["e"])`` without ``ENABLE_LOGIN_SHELL``: a non-login, non-interactive bash."""


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote`` for the printable ASCII/UTF-8 text KubeRay quotes (JSON is the same escaping here)."""
    return json.dumps(text, ensure_ascii=False)


def python_health_command(url: str, timeout_seconds: int) -> str:
    """``BasePythonHealthCommand`` (v1.7.0) formatted with the health URL and timeout."""
    return f"python -c \"import urllib.request; r=urllib.request.urlopen('{url}', timeout={timeout_seconds}); exit(0 if b'success' in r.read() else 1)\""


def _runtime_env_json(spec: Mapping[str, Any]) -> str:
    """``getRuntimeEnvJson``: ``runtimeEnvYAML`` converted to JSON, '' when absent."""
    text = spec.get("runtimeEnvYAML") or ""
    if not text:
        return ""
    return json.dumps(yaml.safe_load(text), separators=(",", ":"), sort_keys=True)


def _go_float(value: float) -> str:
    """Go's ``fmt.Sprintf("%f", x)``: six decimals."""
    return f"{float(value):f}"


def submit_words(rayjob: Mapping[str, Any], *, dashboard_url: str, job_id: str, version: tuple[int, int] = KUBERAY_1_7) -> list[str]:
    """The words of ``BuildJobSubmitCommand(rayJob, K8sJobMode)``; ``dashboard_url`` and ``job_id``
    are the RayJob status fields KubeRay fills in (``status.dashboardURL``, ``status.jobId``)."""
    spec = rayjob["spec"]
    address = dashboard_url if dashboard_url.startswith("http://") else "http://" + dashboard_url
    words: list[str] = []
    if version >= KUBERAY_1_7:
        health = python_health_command(f"{address}/{DASHBOARD_GCS_HEALTH_PATH}", GCS_HEALTH_TIMEOUT_SECONDS)
        wait = go_quote(f"Waiting for Ray Dashboard GCS to become healthy at {address} ...")
        words += ["until", health, ">/dev/null", "2>&1", ";", "do", "echo", wait, ";", "sleep", "2", ";", "done", ";"]
    words += ["if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";", "then"]
    words += ["ray", "job", "submit", "--address", address, "--no-wait"]
    runtime_env = _runtime_env_json(spec)
    if runtime_env:
        words += ["--runtime-env-json", go_quote(runtime_env)]
    metadata = spec.get("metadata") or {}
    if metadata:
        words += ["--metadata-json", go_quote(json.dumps(metadata, separators=(",", ":"), sort_keys=True))]
    if job_id:
        words += ["--submission-id", job_id]
    if spec.get("entrypointNumCpus", 0) > 0:
        words += ["--entrypoint-num-cpus", _go_float(spec["entrypointNumCpus"])]
    if spec.get("entrypointNumGpus", 0) > 0:
        words += ["--entrypoint-num-gpus", _go_float(spec["entrypointNumGpus"])]
    if spec.get("entrypointResources"):
        words += ["--entrypoint-resources", go_quote(spec["entrypointResources"])]
    words += ["--", spec["entrypoint"].strip(), ";", "fi", ";"]
    words += ["ray", "job", "logs", "--address", address, "--follow", job_id]
    return words


def submitter_container_args(rayjob: Mapping[str, Any], *, dashboard_url: str, job_id: str, version: tuple[int, int] = KUBERAY_1_7) -> list[str]:
    """The submitter container's command + args: ``/bin/bash -ce -- '<words joined by spaces>'``."""
    return [*SUBMITTER_SHELL, " ".join(submit_words(rayjob, dashboard_url=dashboard_url, job_id=job_id, version=version))]


def submitter_env(*, dashboard_url: str, job_id: str) -> dict[str, str]:
    """The variables ``configureSubmitterContainer`` adds to the submitter container."""
    return {"PYTHONUNBUFFERED": "1", "RAY_DASHBOARD_ADDRESS": dashboard_url, "RAY_JOB_SUBMISSION_ID": job_id}


def programs_called(script: str) -> list[str]:
    """The programs a submitter script runs, in order of first use (the first word of every simple command).

    Shell keywords and builtins (``until``, ``if``, ``echo``...) are the shell's own; what remains
    is what the image's PATH must provide.
    """
    keywords = {"until", "do", "done", "if", "then", "fi", "!"}
    builtins = {"echo", "exit", "true", "false", ":"}
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    found: list[str] = []
    expect_command = True
    for token in lexer:
        if token == ";":
            expect_command = True
            continue
        if expect_command:
            if token in keywords:
                continue
            if token not in builtins and token not in found:
                found.append(token)
            expect_command = False
    return found
