"""The code sandbox: a SandboxFusion-compatible execution service for ReTool rollouts.

- ``api``: the HTTP request/response models (what SandboxFusion's clients send and expect).
- ``client``: the async client the code-interpreter tool uses (pooled, retries with backoff).
- the engine, no web framework: ``pool`` (warm workers, bounded queue, restarts with backoff),
  ``template`` (the warm interpreter; probes what isolation the kernel allows), ``worker`` and
  ``child`` (one execution: limits, status from wait4 only, memory and disk watched across all its
  processes), ``layers`` (the isolation plan, pure), ``isolation``/``landlock``/``seccomp`` (the
  kernel mechanisms), ``accounting`` (/proc readings, scratch sweep), ``outcome`` (pure decisions).
- ``server`` and ``http_limits``: the FastAPI app (routes, backpressure, metrics) and the request
  limits in front of it (body size, timeouts, connection cap).

docs/sandbox.md has the threat model and what each isolation layer stops.
"""
