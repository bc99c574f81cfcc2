"""Device product names that exist as node labels, so ``spec.hardware.product`` can be checked.

On NVIDIA nodes, GPU feature discovery (part of the NVIDIA GPU operator) labels each node with
``nvidia.com/gpu.product``: the GPU's name as ``nvidia-smi`` reports it, spaces replaced by dashes
(``NVIDIA H200`` -> ``NVIDIA-H200``), with ``-SHARED`` appended under time-slicing and
``-MIG-<profile>`` for MIG devices. A value no node carries leaves every trainer pod Pending with
no error anywhere, so an unknown value is a warning naming the closest known one (not an error:
new GPUs appear faster than this list). Ascend nodes are told apart by other labels
(``accelerator``, ``accelerator-type``, set by the Ascend device plugin and the cluster admin):
``product`` does not select them, and setting it on an Ascend run is a warning too.
"""

from __future__ import annotations

import difflib
import re

from retool.spec.model import RetoolRunSpec
from retool.spec.rules import Problem

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# nvidia.com/gpu.product values of data-centre GPUs used for LLM training and serving.
KNOWN_GPU_PRODUCTS: frozenset[str] = frozenset(
    {
        "NVIDIA-B200",
        "NVIDIA-B300",
        "NVIDIA-GB200",
        "NVIDIA-GH200-480GB",
        "NVIDIA-GH200-144G-HBM3e",
        "NVIDIA-H200",
        "NVIDIA-H200-NVL",
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-H100-PCIe",
        "NVIDIA-H100-NVL",
        "NVIDIA-H800",
        "NVIDIA-H800-PCIe",
        "NVIDIA-H20",
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-A100-SXM4-40GB",
        "NVIDIA-A100-80GB-PCIe",
        "NVIDIA-A100-PCIE-40GB",
        "NVIDIA-A800-SXM4-80GB",
        "NVIDIA-A800-80GB-PCIe",
        "NVIDIA-L40S",
        "NVIDIA-L40",
        "NVIDIA-L20",
        "NVIDIA-L4",
        "NVIDIA-A10",
        "NVIDIA-A40",
        "NVIDIA-RTX-6000-Ada-Generation",
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        "Tesla-V100-SXM2-32GB",
        "Tesla-V100-SXM2-16GB",
        "Tesla-T4",
    }
)
_DECORATION = re.compile(r"-(SHARED|MIG-[0-9a-z.+]+)$")


def closest_gpu_product(value: str) -> str | None:
    """The known product a mistyped or shortened value most likely meant (``H200`` -> ``NVIDIA-H200``)."""
    by_upper = {known.upper(): known for known in KNOWN_GPU_PRODUCTS}
    for candidate in (value.upper(), f"NVIDIA-{value.upper()}", f"TESLA-{value.upper()}"):
        if candidate in by_upper:
            return by_upper[candidate]
    close = difflib.get_close_matches(value.upper(), list(by_upper), n=1, cutoff=0.6)
    return by_upper[close[0]] if close else None


def product_warnings(spec: RetoolRunSpec) -> list[Problem]:
    """Warnings about ``spec.hardware.product`` (empty when it names a label value nodes carry)."""
    product = spec.hardware.product
    if not product:
        return []
    if spec.hardware.accelerator != "nvidia":
        return [
            Problem(
                "spec.hardware.product",
                f"{product!r} has no effect on {spec.hardware.accelerator} runs (it sets the {GPU_PRODUCT_LABEL} node selector of NVIDIA runs); "
                "select Ascend nodes with hardware.nodeSelector, e.g. accelerator-type",
            )
        ]
    if _DECORATION.sub("", product) in KNOWN_GPU_PRODUCTS:
        return []
    close = closest_gpu_product(_DECORATION.sub("", product))
    hint = f"did you mean {close!r}? " if close else ""
    return [
        Problem(
            "spec.hardware.product",
            f"{product!r} is not a known {GPU_PRODUCT_LABEL} value (GPU feature discovery labels nodes with the GPU name, spaces as dashes); "
            f"{hint}trainer pods stay Pending if no node carries it (check: kubectl get nodes -L {GPU_PRODUCT_LABEL})",
        )
    ]
