"""What every execution starts with, through the real server (issue 50, item 7).

- its environment is exactly the clean one (``child.SAFE_ENV`` and its own directory), never the
  server's: not its credentials or service addresses, not what the template keeps (``PASS_ENV``);
- Landlock leaves it the devices a fresh interpreter reads (``landlock.DEVICES``: /dev/urandom...);
- it cannot signal its zygote where it shares the zygote's uid inside a pid namespace and Landlock
  does not scope signals: only the seccomp guard (``ExecutionPolicy.protected``) stands there, for
  every signal call (``kill``, ``tgkill``, ``tkill``, ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``).

One replica shaped for the last case serves all three: the pod with user namespaces (``pod-userns``:
executions share the server's uid, each worker is pid 1 of its own pid namespace) on a kernel whose
Landlock has no signal scope (ABI 5, Linux 6.10-6.11; ``RETOOL_SANDBOX_LANDLOCK_MAX_ABI`` reproduces
it on a newer kernel).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.sandbox.conftest import SECRET, RunningServer, start_server, stop_server

CREDENTIAL = f"cred-{SECRET}"
SERVICE = "mlflow-7f3a.retool-runs.svc.cluster.local"
SERVER_ENV = {
    # What a deployed replica's environment holds beside its settings: a Secret exposed through
    # envFrom, Kubernetes' service links, and variables the template keeps (``PASS_ENV``).
    "AWS_SECRET_ACCESS_KEY": CREDENTIAL,
    "MLFLOW_TRACKING_URI": f"http://{SERVICE}:5000",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "RUN_MLFLOW_SERVICE_HOST": SERVICE,
    "TZ": "Pacific/Auckland",
    "LC_ALL": "C.UTF-8",
}


@pytest.fixture(scope="module")
def replica() -> Iterator[RunningServer]:
    running = start_server(1, kind="pod-userns", uid=10051, RETOOL_SANDBOX_LANDLOCK_MAX_ABI="5", **SERVER_ENV)
    yield running
    stop_server(running)


def run(server: RunningServer, code: str) -> dict:
    reply = httpx.post(f"{server.url}/run_code", json={"code": code, "language": "python", "run_timeout": 20}, timeout=60).json()
    assert reply["status"] == "Success", reply
    return reply["run_result"]


ENVIRONMENT = """
import json, os
print(json.dumps({"cwd": os.getcwd(), "environ": dict(os.environ), "initial": open("/proc/self/environ", "rb").read().decode(errors="replace")}))
"""


def test_an_execution_gets_the_clean_environment_not_the_servers(replica: RunningServer) -> None:
    server_environ = Path(f"/proc/{replica.pid}/environ").read_bytes().decode(errors="replace")
    assert CREDENTIAL in server_environ and SERVICE in server_environ  # there to leak
    found = json.loads(run(replica, ENVIRONMENT)["stdout"])
    cwd = found["cwd"]
    # Written out, not read from child.SAFE_ENV: a variable added there must show here too.
    assert found["environ"] == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HOME": cwd,
        "TMPDIR": cwd,
        "PWD": cwd,
    }, found["environ"]
    # The environment block the process was started with (the template's, kept by every fork) holds
    # only what the template was given (``PASS_ENV``), never the server's credentials or addresses.
    for leaked in (CREDENTIAL, SERVICE, "10.96.0.1", "RETOOL_SANDBOX_"):
        assert leaked not in found["initial"], found["initial"]


DEVICES = """
import json, os, random, numpy
facts = {}
for path in ("/dev/urandom", "/dev/random", "/dev/zero"):
    with open(path, "rb") as device:
        facts[path] = len(device.read(32))
with open("/dev/null", "wb") as null:
    facts["/dev/null"] = null.write(b"x")
facts["os.urandom"] = len(os.urandom(16))
random.seed()
numpy.random.seed()
facts["draws"] = [random.random() != random.random(), int(numpy.random.default_rng().integers(1 << 30)) >= 0]
try:
    os.listdir("/dev")
    facts["list /dev"] = "listed"
except PermissionError:
    facts["list /dev"] = "refused"
print(json.dumps(facts))
"""


def test_landlock_leaves_an_execution_dev_urandom(replica: RunningServer) -> None:
    """Code reads /dev/urandom itself (and libraries do, where ``getrandom`` is missing): the device
    rules of the Landlock domain let it, while /dev itself stays closed."""
    used = replica.readyz()["isolation"]["landlock_abi_used"]
    if used < 1:
        pytest.skip("this kernel has no Landlock (Linux < 5.13): nothing confines /dev")
    facts = json.loads(run(replica, DEVICES)["stdout"])
    assert facts == {
        "/dev/urandom": 32,
        "/dev/random": 32,
        "/dev/zero": 32,
        "/dev/null": 1,
        "os.urandom": 16,
        "draws": [True, True],
        "list /dev": "refused",  # the domain is in force: only the devices' own rules open them
    }, facts


ZYGOTE = """
import ctypes, errno, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": {"tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297},
    "aarch64": {"tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240},
}[os.uname().machine]
def queued(sig):
    info = ctypes.create_string_buffer(128)  # siginfo: si_signo, si_errno, si_code = SI_QUEUE
    ctypes.memmove(info, (ctypes.c_int * 3)(sig, 0, -1), 12)
    return info
def raw(name, *args):
    result = libc.syscall(ctypes.c_long(NR[name]), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]
def kill(pid, sig):
    try:
        os.kill(pid, sig)
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
CALLS = {
    "kill": lambda pid, sig: kill(pid, sig),
    "kill(-pgid)": lambda pid, sig: kill(-os.getpgid(pid), sig),
    "tgkill": lambda pid, sig: raw("tgkill", pid, pid, sig),
    "tkill": lambda pid, sig: raw("tkill", pid, sig),
    "rt_sigqueueinfo": lambda pid, sig: raw("rt_sigqueueinfo", pid, sig, queued(sig)),
    "rt_tgsigqueueinfo": lambda pid, sig: raw("rt_tgsigqueueinfo", pid, pid, sig, queued(sig)),
}
zygote, me = os.getppid(), os.getpid()
facts = {"own": {name: call(me, 0) for name, call in CALLS.items()}}
facts["zygote"] = {name: call(zygote, 0) for name, call in CALLS.items()}
print(json.dumps(facts), flush=True)
for name, call in CALLS.items():  # the real thing: had one got through, nothing below would print
    call(zygote, signal.SIGKILL)
print(json.dumps({"zygote_after": open(f"/proc/{zygote}/stat").read().split(")")[1].split()[0]}))
"""


def test_an_execution_cannot_signal_its_zygote_by_any_call(replica: RunningServer) -> None:
    """Signal 0 asks the kernel whether the signal may be sent, without sending it: each call reaches
    the execution's own process and is refused towards the zygote; then SIGKILL through each, and
    the zygote, its worker and the next execution are still there."""
    isolation = replica.readyz()["isolation"]
    if isolation["mode"] != "user-namespaces":
        pytest.skip(f"no user namespaces for an unprivileged server here ({isolation['problems']}): executions share no pid namespace with their zygote")
    assert isolation["landlock_abi_used"] < 6 and "landlock-signal-scope" not in isolation["layers"], isolation  # the seccomp guard alone
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip(f"no system call numbers written here for {os.uname().machine}")
    restarts = replica.readyz()["worker_restarts"]
    lines = run(replica, ZYGOTE)["stdout"].splitlines()
    facts = json.loads(lines[0])
    assert facts["own"] == dict.fromkeys(facts["own"], "ok"), facts  # each call works as written
    assert facts["zygote"] == dict.fromkeys(facts["own"], "EPERM"), facts
    assert json.loads(lines[1])["zygote_after"] in ("S", "R", "D"), lines  # alive, not a zombie
    assert run(replica, "print('next')")["stdout"] == "next\n"
    assert replica.readyz()["worker_restarts"] == restarts
