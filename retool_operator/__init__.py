"""The ReTool kopf operator: turns a RetoolRun into a sandbox, MLflow tracking and one child per stage.

``handlers`` holds the kopf handlers (thin I/O); ``builders``, ``reconcile``, ``status`` and
``profiles`` are pure functions over the RetoolRun model, table-tested without a cluster.
"""
