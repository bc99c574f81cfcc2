"""The privileges of a sandbox pod: a non-root pod, or root of the pod's own user namespace.

What the sandbox server can isolate depends on what the pod lets it do (``retool.sandbox.layers``
probes it at start). Two shapes, chosen by the operator's configuration (the chart's
``sandbox.userNamespaces``), never by a run, because they need cluster support and a Pod Security
level that only the cluster's operator knows:

- **non-root** (the fallback): uid 10001, every capability dropped, no privilege escalation,
  ``RuntimeDefault`` seccomp. Fits Pod Security ``restricted``. The server cannot create
  namespaces here: unprivileged it may not, and the container runtimes' default seccomp profile
  (what ``RuntimeDefault`` is) allows ``unshare``, ``setns``, ``mount`` and ``clone`` with
  namespace flags only to a container that holds ``CAP_SYS_ADMIN``. Executions are isolated by
  Landlock and the server's own seccomp filter (strong on Linux >= 5.13).
- **user namespace** (``hostUsers: false``): the pod gets its own user namespace whose ids map to an
  unprivileged range on the node, and capabilities granted to the container are valid only inside
  it. The server runs as uid 0 *of that namespace* with ``SETUID``, ``SETGID``, ``CHOWN``,
  ``DAC_OVERRIDE``, ``FOWNER`` and ``KILL``, so each execution slot runs under a uid of its own
  (``UID_BASE + i``, inside the 0-65535 the pod maps); with ``SYS_ADMIN`` too, ``RuntimeDefault``
  lets it create every worker's pid, network and mount namespaces. ``allowPrivilegeEscalation``
  stays false (no_new_privs: the server never gains privileges, it only drops them). The
  capability is spelled ``SYS_ADMIN``: the API refuses ``CAP_SYS_ADMIN`` together with
  ``allowPrivilegeEscalation: false``.

Pod Security: ``baseline`` admits the six capabilities and a root ``runAsUser`` (only
``restricted`` requires ``runAsNonRoot``, and relaxes that for user-namespace pods only with the
``UserNamespacesPodSecurityStandards`` gate, alpha and off by default); ``SYS_ADMIN`` is in no
level but ``privileged``. Hence ``sys_admin``: off keeps the pod admissible under ``baseline``.

Cluster support: the ``UserNamespacesSupport`` feature gate is alpha (off) in 1.28-1.29, beta off
by default in 1.30-1.32 and beta on by default from 1.33; the nodes need Linux >= 6.3 (idmap mounts
on tmpfs) and containerd >= 2.0 or CRI-O >= 1.25 (runc >= 1.2 or crun >= 1.9). With the gate off
the API server drops ``hostUsers`` from the pod, and containerd 1.6 or older ignores it: the pod
would then run as root of the node. The sandbox's ``/readyz`` reports that (``isolation.problems``)
and the operator's SandboxIsolation condition shows it; ``spec.sandbox.isolation: strict`` keeps
such a replica from serving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SANDBOX_RUN_AS_USER = 10001  # the sandbox image's USER
USERNS_CAPABILITIES = ("SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL")
"""What running each execution under its own uid takes (``retool.sandbox`` probes ``uid_switch``)."""
NAMESPACE_CAPABILITY = "SYS_ADMIN"
"""What creating the workers' pid, network and mount namespaces takes (and what RuntimeDefault checks)."""


@dataclass(frozen=True)
class SandboxSecurity:
    """The pod-level and container-level security settings of a sandbox pod."""

    host_users: bool | None
    pod: dict[str, Any] = field(default_factory=dict)
    container: dict[str, Any] = field(default_factory=dict)


def sandbox_security(*, user_namespaces: bool, sys_admin: bool = True) -> SandboxSecurity:
    """The shape of a sandbox pod (see the module docstring for why each field is what it is)."""
    seccomp = {"type": "RuntimeDefault"}
    if not user_namespaces:
        uid = SANDBOX_RUN_AS_USER
        return SandboxSecurity(
            host_users=None,
            pod={"runAsNonRoot": True, "runAsUser": uid, "fsGroup": uid, "seccompProfile": seccomp},
            container={
                "runAsNonRoot": True,
                "runAsUser": uid,
                "runAsGroup": uid,
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": seccomp,
            },
        )
    add = [NAMESPACE_CAPABILITY, *USERNS_CAPABILITIES] if sys_admin else list(USERNS_CAPABILITIES)
    container: dict[str, Any] = {
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": add},
        "seccompProfile": seccomp,
    }
    if sys_admin:
        # The kernel mounts a fresh /proc in a worker's pid namespace only where the container's
        # /proc is not partly masked; Unmasked is allowed for hostUsers: false pods (ProcMountType,
        # dropped where that gate is off) and, like SYS_ADMIN, is within the privileged level only.
        container["procMount"] = "Unmasked"
    return SandboxSecurity(
        host_users=False,
        pod={"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "seccompProfile": seccomp},
        container=container,
    )
