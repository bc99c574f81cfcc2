"""``Retry-After`` as both of our HTTP clients read it (the operator's API client, the sandbox client).

Only the delta-seconds form counts: kube-apiserver sends it (``"1"`` from its APF and max-in-flight
filters, k8s.io/apiserver/pkg/server/filters, v0.36) and so does our sandbox server; an HTTP date or
anything else is None, and the caller's own back-off applies.
"""

from __future__ import annotations


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds; None when absent, negative, a date or garbage."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
