"""Which isolation layers a replica runs with: probed once, decided once, applied by every worker,
reported as they are (pure: no I/O, table-tested).

The template probes what this kernel and these privileges allow (``Probes``: each probe runs in a
throw-away process, so a failed attempt never leaves a half-isolated worker behind); the server
turns that and its settings into one ``Plan``; every worker applies the plan exactly and exits if it
cannot. ``describe`` is what /readyz and /metrics publish.

Strong isolation means every path from one execution to another execution or to the server is
closed by a kernel-enforced layer:

- filesystem: a private mount namespace, or a uid of its own, or Landlock;
- signals: a pid namespace, or a uid of its own, or Landlock's signal scope, or the seccomp guard;
- ptrace-like access: the same, or any Landlock domain;
- network (the server's own port on loopback): a network namespace, or the seccomp socket guard,
  or Landlock's TCP rules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

NAMESPACE_MODES = ("root-namespaces", "user-namespaces")
GUARDED = ("filesystem", "signals", "ptrace", "network")


@dataclass(frozen=True)
class Probes:
    """What the template found it can do, each tried in a throw-away process."""

    euid: int
    uid_switch: bool
    """It holds what running executions under their own uids takes (root with SETUID, KILL, ...)."""
    namespaces: str | None
    """The namespace mode a throw-away worker set up completely, or None."""
    private_proc: bool
    namespace_error: str | None
    landlock_abi: int
    seccomp_error: str | None
    host_userns: bool = False
    """The server is in the node's own user namespace (its uid map is the whole identity range), not a pod's."""
    native_setup_error: str | None = "not probed"
    """Why executions cannot make their setup with the compiled helper (``child.native_setup_error``); None: they can."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Probes:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Plan:
    """What every worker of the replica applies; sent to each worker in its spawn config."""

    namespaces: str | None
    private_proc: bool
    uid_per_execution: bool
    landlock_abi: int
    seccomp: bool
    kernel_landlock_abi: int = 0
    runtime_class: str | None = None
    root_on_node: bool = False
    """The server is root of the node's user namespace, outside any sandboxing runtime."""
    problems: tuple[str, ...] = field(default=())
    cgroup_version: int = 0
    """1 or 2: every execution runs in a memory and a pids cgroup of its own (``cgroups``); 0: none."""
    cgroup_dirs: tuple[str, ...] = ()
    """Where the executions' cgroups are made (v1: the memory then the pids directory; v2: one)."""
    cgroup_note: str | None = None
    """Why there are no per-execution cgroups (what the attempt to make them said)."""
    native_setup: bool = False
    """Executions make their setup in one native call (``_settle.c``), not from Python: the same
    layers, ~1 ms less CPU per request."""
    native_setup_note: str | None = None
    """Why not, when not."""

    @property
    def signals_scoped(self) -> bool:
        """Signals cannot leave the execution anyway (pid namespace, or Landlock's signal scope)."""
        return self.namespaces is not None or self.landlock_abi >= 6

    @property
    def private_tmp(self) -> bool:
        return self.namespaces is not None

    @property
    def deny_chmod(self) -> bool:
        """Executions share the replica's uid (they own its scratch root), or nothing confines the
        filesystem: no execution may change a mode (a scratch root at 000 breaks every later worker)."""
        return not self.uid_per_execution or (not self.private_tmp and self.landlock_abi < 1)

    @property
    def replica_counts_processes(self) -> bool:
        """Executions share the replica's uid and see its processes (no uid of their own, no pid
        namespace): RLIMIT_NPROC counts every process of that uid, so each execution's limit adds the
        replica's count, which the server makes at dispatch (``pool``)."""
        return not self.uid_per_execution and self.namespaces is None

    @property
    def needs_sweep(self) -> bool:
        """Executions can write to the shared /tmp, /var/tmp and /dev/shm: clean them after each."""
        return not self.private_tmp and self.landlock_abi < 1

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = list(self.problems)
        data["cgroup_dirs"] = list(self.cgroup_dirs)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["problems"] = tuple(values.get("problems", ()))
        values["cgroup_dirs"] = tuple(values.get("cgroup_dirs", ()))
        return cls(**values)


def decide(
    probes: Probes, *, namespaces: str = "auto", landlock_max_abi: int | None = None, seccomp: bool = True, runtime_class: str | None = None, native_setup: bool = True
) -> Plan:
    """The plan for this replica: every layer the kernel has, minus what the settings turn off."""
    problems: list[str] = []
    mode = probes.namespaces if namespaces == "auto" else None
    if namespaces != "auto":
        problems.append("namespaces turned off by configuration (RETOOL_SANDBOX_NAMESPACES=off)")
    elif mode is None:
        problems.append(f"no namespaces ({probes.namespace_error or 'not available'}): executions share the pod's network, processes and scratch volume")
    uid_per_execution = probes.uid_switch and mode != "user-namespaces"
    if not uid_per_execution:
        problems.append(f"executions run as the server's uid {probes.euid} (no privilege to give each its own)")
    private_proc = mode is not None and probes.private_proc
    if mode is not None and not private_proc:
        problems.append("could not mount a private /proc: executions can list (not signal or read) the replica's processes")
    if mode is None:
        problems.append("no private /proc: executions can read the command lines (not the memory, environment or files) of the replica's other processes")
    abi = probes.landlock_abi
    if landlock_max_abi is not None and landlock_max_abi < abi:
        problems.append(f"Landlock limited to ABI {landlock_max_abi} by configuration (kernel: {abi})")
        abi = max(0, landlock_max_abi)
    if abi < 1:
        problems.append("no Landlock (kernel < 5.13, or turned off): the filesystem is confined only by namespaces or uids")
    else:
        if abi < 4:
            problems.append(f"Landlock ABI {abi} has no TCP rules (needs 4, Linux 6.7)")
        if abi < 6 and mode is None:
            problems.append(
                f"Landlock ABI {abi} has no signal scope (needs 6, Linux 6.12): executions may signal only their own main process and process group"
            )
    root_on_node = probes.euid == 0 and probes.host_userns and runtime_class is None
    if root_on_node:
        problems.append(
            "the server is root of the node's user namespace (no pod user namespace: hostUsers: false dropped by the API server"
            " or ignored by the runtime, or a root container): executions stay isolated, but a breakout of the server would be root on the node"
        )
    use_seccomp = seccomp and probes.seccomp_error is None
    if not seccomp:
        problems.append("seccomp turned off by configuration (RETOOL_SANDBOX_SECCOMP=false)")
    elif probes.seccomp_error is not None:
        problems.append(probes.seccomp_error)
    return Plan(
        namespaces=mode,
        private_proc=private_proc,
        uid_per_execution=uid_per_execution,
        landlock_abi=abi,
        seccomp=use_seccomp,
        kernel_landlock_abi=probes.landlock_abi,
        runtime_class=runtime_class,
        root_on_node=root_on_node,
        problems=tuple(problems),
        native_setup=native_setup and probes.native_setup_error is None,
        native_setup_note=probes.native_setup_error if native_setup else None,
    )


def layers(plan: Plan) -> list[str]:
    """Every layer in force, by name (what the operator shows in the run's status)."""
    names = []
    if plan.uid_per_execution:
        names.append("uid-per-execution")
    if plan.namespaces is not None:
        names += ["pid-namespace", "network-namespace", "mount-namespace"]
        if plan.namespaces == "user-namespaces":
            names.append("user-namespace")
        if plan.private_proc:
            names.append("private-proc")
    if plan.landlock_abi >= 1:
        names.append("landlock-filesystem")
    if plan.landlock_abi >= 4:
        names.append("landlock-network")
    if plan.landlock_abi >= 6:
        names += ["landlock-signal-scope", "landlock-abstract-unix-scope"]
    if plan.seccomp:
        names.append("seccomp")
    if plan.private_tmp:
        names.append("scratch-tmpfs")
    else:
        names += ["scratch-dir", "disk-watch"]
        if plan.needs_sweep:
            names.append("scratch-sweep")
    if plan.cgroup_version:
        names += ["memory-cgroup", "pids-cgroup"]
    names.append("memory-watch")
    return names


def guards(plan: Plan) -> dict[str, list[str]]:
    """For each way out of an execution, the layers that close it (empty: open)."""
    ns = plan.namespaces is not None
    uid = plan.uid_per_execution
    landlock = plan.landlock_abi >= 1
    return {
        "filesystem": [name for name, on in (("mount-namespace", ns), ("uid", uid), ("landlock", landlock)) if on],
        "signals": [
            name for name, on in (("pid-namespace", ns), ("uid", uid), ("landlock-scope", plan.landlock_abi >= 6), ("seccomp", plan.seccomp)) if on
        ],
        "ptrace": [name for name, on in (("pid-namespace", ns), ("uid", uid), ("landlock", landlock), ("seccomp", plan.seccomp)) if on],
        "network": [name for name, on in (("network-namespace", ns), ("seccomp", plan.seccomp), ("landlock", plan.landlock_abi >= 4)) if on],
    }


def is_strong(plan: Plan) -> bool:
    return all(guards(plan)[way] for way in GUARDED)


def describe(plan: Plan) -> dict[str, Any]:
    """The ``isolation`` object of /readyz."""
    strong = is_strong(plan)
    active = layers(plan)
    return {
        "mode": plan.namespaces or "none",
        "strong": strong,
        "summary": ("strong" if strong else "weak") + ": " + ", ".join(active),
        "layers": active,
        "guards": guards(plan),
        "landlock_abi": plan.kernel_landlock_abi,
        "landlock_abi_used": plan.landlock_abi,
        "network_isolated": plan.namespaces is not None,
        "pid_namespace": plan.namespaces is not None,
        "private_tmp": plan.private_tmp,
        "privilege_drop": plan.uid_per_execution,
        "runtime_class": plan.runtime_class,
        "root_on_node": plan.root_on_node,
        "cgroups": f"v{plan.cgroup_version}" if plan.cgroup_version else None,
        "cgroups_note": plan.cgroup_note,
        "execution_setup": "native" if plan.native_setup else "python",
        "execution_setup_note": plan.native_setup_note,
        "problems": list(plan.problems),
    }
