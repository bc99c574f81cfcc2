"""Start a sandbox server the way a Kubernetes pod runs it, from a test process that runs as root.

Kinds (what the operator can deploy, see docs/sandbox.md):

- ``pod``: the restricted pod: uid 10001, every capability dropped (bounding set too), no_new_privs,
  and a seccomp filter that refuses new namespaces the way the RuntimeDefault profile does for a
  process without CAP_SYS_ADMIN. The server is pid 1 of its own pid namespace, as in a container.
- ``pod-userns``: the same without that filter (a node or profile that lets unprivileged processes
  create user namespaces): the workers can use user namespaces.
- ``k8s-userns``: ``hostUsers: false``: the server is root inside a user namespace mapping 0..65535
  to unprivileged host uids 200000.., with exactly the capabilities docs/sandbox.md tells the
  operator to grant (SYS_ADMIN, SETUID, SETGID, CHOWN, DAC_OVERRIDE, FOWNER, KILL) and
  no_new_privs (``allowPrivilegeEscalation: false``).

Every kind gets a private mount namespace where /tmp (512 MB), /var/tmp and /dev/shm (64 MB) are
fresh tmpfs (the pod's emptyDir and shm), and where the Python installation under /root (mode 700
here) is made reachable: a tmpfs over /root with just the interpreter's tree bound back.

Usage (the test fixtures build this): ``podlike.command(kind, argv)`` gives the command line that
runs ``argv`` in that environment.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from retool.sandbox import isolation, seccomp  # noqa: E402

POD_UID = 10001
USERNS_HOST_BASE = 200000
K8S_USERNS_CAPS = ("sys_admin", "setuid", "setgid", "chown", "dac_override", "fowner", "kill")
KINDS = ("pod", "pod-userns", "k8s-userns")
EXPOSED = (sys.base_prefix, sys.prefix, str(REPO))


def command(kind: str, argv: list[str], *, uid: int = POD_UID, pid_namespace: bool = True, expose: tuple[str, ...] = ()) -> list[str]:
    """The command line that runs ``argv`` as a pod of ``kind`` would (run it as root). ``expose``:
    more trees the pod must see as they are, beside this checkout and the interpreter (another
    checkout a benchmark starts: under /tmp it would otherwise be hidden by the pod's fresh /tmp,
    and the server would import this checkout's code instead, through the editable install)."""
    if kind not in KINDS:
        raise ValueError(kind)
    namespaces = ["--mount", "--propagation", "private"]
    if pid_namespace:
        namespaces += ["--pid", "--fork", "--mount-proc", "--kill-child"]
    stage = [sys.executable, str(HERE), "prepare", kind, str(uid), *expose, "--", *argv]
    line = ["unshare", *namespaces, "--", *stage]
    if kind == "k8s-userns":  # util-linux's --map-users needs newuidmap: map the range ourselves
        line = [sys.executable, str(HERE), "userns", "--", *line]
    return line


def enter_userns(argv: list[str]) -> None:
    """As host root: run ``argv`` as root of a new user namespace mapping 0..65535 to host 200000..

    The child unshares; this process (still in the host's namespace, with CAP_SETUID there) writes
    its maps; the child becomes uid 0 inside and execs. We wait and pass on its exit status.
    """
    # The interpreter must be reachable before the exec inside the namespace: expose it first, in a
    # mount namespace of our own (the namespaces created inside inherit it).
    isolation.unshare(isolation.CLONE_NEWNS)
    isolation.mount("none", "/", None, isolation.MS_REC | isolation.MS_PRIVATE)
    for target in EXPOSED:
        _expose(target)
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(mapped_w)
        isolation.unshare(isolation.CLONE_NEWUSER)
        os.write(ready_w, b"u")
        if os.read(mapped_r, 1) != b"m":
            os._exit(70)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        isolation.die_with_parent()
        os.execvp(argv[0], argv)
    os.close(ready_w)
    os.close(mapped_r)
    if os.read(ready_r, 1) != b"u":
        raise SystemExit("the user namespace could not be created")
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {USERNS_HOST_BASE} 65536")
    os.write(mapped_w, b"m")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    _, status = os.waitpid(pid, 0)
    raise SystemExit(os.waitstatus_to_exitcode(status))


def _expose(target: str) -> None:
    """Make ``target`` reachable by any uid: a tmpfs over its first unsearchable ancestor, with the
    one subtree on the way to ``target`` bound back into it."""
    parts = Path(os.path.realpath(target)).parts
    for depth in range(1, len(parts)):
        ancestor = os.path.join(*parts[: depth + 1])
        if os.stat(ancestor).st_mode & 0o001:
            continue
        if depth + 1 >= len(parts):
            return
        keep = os.path.join(ancestor, parts[depth + 1])
        fd = os.open(keep, os.O_PATH)
        isolation.mount("tmpfs", ancestor, "tmpfs", isolation.MS_NOSUID | isolation.MS_NODEV, "mode=0755,size=1m")
        os.mkdir(keep)
        isolation.mount(f"/proc/self/fd/{fd}", keep, None, isolation.MS_BIND | isolation.MS_REC)
        os.close(fd)
        return


def prepare(kind: str, uid: int, argv: list[str], expose: tuple[str, ...] = ()) -> None:
    """As root inside the new namespaces: the pod's filesystem, then its privileges, then exec."""
    exposed = (*EXPOSED, *expose)
    for target in exposed:
        _expose(target)
    scratch = {"/tmp": "size=512m", "/var/tmp": "size=64m", "/dev/shm": "size=64m"}
    for path, size in scratch.items():
        # A checkout or venv under a scratch directory (a clone in /tmp) stays visible: it is bound
        # back into the pod's fresh tmpfs, as the image's own files are outside the pod's emptyDirs.
        inside = [os.path.realpath(t) for t in exposed if os.path.realpath(t).startswith(path.rstrip("/") + "/")]
        kept = [(target, os.open(target, os.O_PATH)) for target in inside]
        isolation.mount("tmpfs", path, "tmpfs", isolation.MS_NOSUID | isolation.MS_NODEV, f"mode=1777,{size}")
        for target, fd in kept:
            os.makedirs(target, mode=0o755, exist_ok=True)
            isolation.mount(f"/proc/self/fd/{fd}", target, None, isolation.MS_BIND | isolation.MS_REC)
            os.close(fd)
    if kind == "k8s-userns":
        caps = ",".join(["-all", *(f"+{cap}" for cap in K8S_USERNS_CAPS)])
        os.execvp("setpriv", ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "--no-new-privs", "--", *argv])
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    if kind == "pod":
        argv = [sys.executable, str(HERE), "deny-namespaces", "--", *argv]
    os.execvp("setpriv", [*drop, *argv])


def deny_namespaces(argv: list[str]) -> None:
    """The RuntimeDefault profile's rule for a process without CAP_SYS_ADMIN, then exec."""
    seccomp.install(seccomp.build_namespace_denial(os.uname().machine))
    os.execvp(argv[0], argv)


def main() -> None:
    split = sys.argv.index("--")
    head, argv = sys.argv[1:split], sys.argv[split + 1 :]
    if head[0] == "userns":
        enter_userns(argv)
    elif head[0] == "prepare":
        prepare(head[1], int(head[2]), argv, tuple(head[3:]))
    elif head[0] == "deny-namespaces":
        deny_namespaces(argv)
    raise SystemExit(f"unknown stage {head}")


if __name__ == "__main__":
    main()
