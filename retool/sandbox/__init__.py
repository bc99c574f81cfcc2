"""The code sandbox: a SandboxFusion-compatible execution service for ReTool rollouts.

- ``api``: the HTTP request/response models (what SandboxFusion's clients send and expect).
- ``client``: the async client the code-interpreter tool uses (pooled, retries with backoff).
- ``engine``: warm template interpreter, worker processes and isolated executions; no web framework.
- ``server``: the FastAPI app (routes, backpressure, metrics) on top of the engine.
"""
