"""``python -m retool.runtime.cpu_only -m MODULE ARGS...``: run a Python module with no accelerator backend.

The merge (``verl.model_merger``) works on CPU, but on an Ascend node it would still meet
torch_npu twice: torch autoloads every installed device backend on ``import torch`` (the
``torch.backends`` entry points), and transformers, accelerate and verl import ``torch_npu``
whenever it is installed. Without an NPU in the container the Ascend runtime mounts no driver,
so that import fails. This launcher switches the autoload off and blocks the listed backend
modules the way the import system documents (``None`` in ``sys.modules``: ``import`` raises
ModuleNotFoundError and ``importlib.util.find_spec`` answers None, so every library takes its
"not installed" path) before the module runs, so the process never touches them.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import MutableMapping, Sequence

HIDDEN_BACKENDS = ("torch_npu",)
"""Top-level modules of device backends this process must never load."""


def hide_backends(environ: MutableMapping[str, str] = os.environ) -> None:
    """Disable torch's backend autoload and block the backend modules (call before ``import torch``)."""
    loaded = [name for name in HIDDEN_BACKENDS if sys.modules.get(name) is not None]
    if loaded:
        raise RuntimeError(f"{', '.join(loaded)} was imported before retool.runtime.cpu_only could keep it out")
    environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    for name in HIDDEN_BACKENDS:
        sys.modules[name] = None  # type: ignore[assignment]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "-m":
        sys.stderr.write("usage: python -m retool.runtime.cpu_only -m MODULE [ARGS...]\n")
        raise SystemExit(2)
    hide_backends()
    module = args[1]
    sys.argv = [module, *args[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
