"""verl 0.9.1 on CPU: a ``PlatformBase`` for ``VERL_PLATFORM=cpu`` (rehearsal on a CPU machine, no accelerator).

verl 0.9.1 resolves every device question through one platform object
(``verl/plugin/platform/platform_manager.py``: ``get_platform()``, chosen by ``VERL_PLATFORM`` or
detection among registered platforms). It registers ``nvidia``, ``npu`` and ``rocm`` and, finding
none of them, falls back to ``nvidia`` - so on a CPU machine verl would ask ``torch.cuda`` for
everything. Its ``PlatformRegistry.register`` is the documented way to add a platform from outside
verl; this module registers ``cpu``:

- the device is ``cpu`` and the collective backend ``gloo`` (verl's process group is then
  ``cpu:gloo,cpu:gloo``: ``verl/utils/distributed.py`` ``initialize_global_process_group``);
- ``device_module`` is :class:`CPUDeviceModule`: the calls verl makes on ``get_torch_device()``
  (``empty_cache``, ``synchronize``, the RNG state a checkpoint saves, the memory figures it logs)
  answered for the host, where ``torch.cpu`` lacks them;
- Ray: a device is one Ray ``GPU`` declared by the node (``ray start --num-gpus``; KubeRay: the
  group's ``resources``), which Ray hands out as a label without touching a device. Not a resource
  of our own name: verl 0.9.1 checks the cluster's room by counting only ``GPU`` or ``NPU``
  (``ResourcePoolManager._check_resource_available``, ``verl/single_controller/ray/base.py``), so a
  run's ``hardware.devicesPerNode`` is its number of training processes per node, declared as GPUs.

Imports verl; registered in every process of a run through ``VERL_USE_EXTERNAL_MODULES``
(``retool.recipe.verl_plugins.v0_9.cpu``).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"
"""The name ``VERL_PLATFORM`` selects."""
RAY_RESOURCE = "GPU"
"""The Ray resource of one training process on a CPU node (see the module docstring)."""


def _peak_rss_bytes() -> int:
    """The process's peak resident set (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize()


class CPUDeviceModule:
    """``torch.cpu`` plus what verl calls on ``get_torch_device()`` that ``torch.cpu`` has not.

    The memory figures verl logs (``perf/max_memory_allocated_gb``, ...) are the process's real
    resident memory, not zeros; ``mem_get_info`` is the host's (free, total) from ``/proc/meminfo``.
    """

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(_device: Any) -> None:
        return None

    @staticmethod
    def synchronize(_device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(_fraction: float, _device: Any = None) -> None:
        return None

    @staticmethod
    def current_stream(_device: Any = None) -> Any:
        return torch.cpu.current_stream()

    @staticmethod
    def stream(stream: Any = None) -> Any:
        return torch.cpu.stream(stream)

    @staticmethod
    def get_rng_state(_device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, _device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def memory_allocated(_device: Any = None) -> int:
        return _rss_bytes()

    @staticmethod
    def memory_reserved(_device: Any = None) -> int:
        return _rss_bytes()

    @staticmethod
    def max_memory_allocated(_device: Any = None) -> int:
        return _peak_rss_bytes()

    @staticmethod
    def max_memory_reserved(_device: Any = None) -> int:
        return _peak_rss_bytes()

    @staticmethod
    def reset_peak_memory_stats(_device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(_device: Any = None) -> tuple[int, int]:
        fields: dict[str, int] = {}
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields.get("MemAvailable", fields.get("MemFree", 0)), fields.get("MemTotal", 0)

    @staticmethod
    def get_device_name(_device: Any = None) -> str:
        return "cpu"


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """The host CPU as verl's device (see the module docstring)."""

    _module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it (a GPU node must keep CUDA).
        return False

    def current_device(self) -> str:
        # verl moves tensors with ``.to(get_device_id())`` (the FSDP engine, 0.9.1): an index would mean cuda:N.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # No device to hide; a variable no runtime reads, so verl's bookkeeping of it is harmless.
        return "RETOOL_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
