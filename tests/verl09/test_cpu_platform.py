"""verl 0.9.1 on CPU: what ``VERL_USE_EXTERNAL_MODULES=retool.recipe.verl_plugins.v0_9.cpu`` puts in place in a fresh process.

Each check runs in a new interpreter with the environment a CPU stage's processes get
(``retool.recipe.render.common.CPU_ENV``), because verl resolves its platform once per process,
inside ``import verl``. Without our module the same process group cannot even start: verl asks
torch for ``cpu:gloo,cpu:gloo``, which torch refuses (shown below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from retool.recipe.render.common import CPU_ENV
from tests.conftest import free_port

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    """
    import json, os
    import verl  # loads VERL_USE_EXTERNAL_MODULES
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_device_name, get_torch_device
    from verl.utils.distributed import initialize_global_process_group_ray
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class
    import torch.distributed as dist

    out = {"device": get_device_name(), "ray_resource": get_platform().ray_resource_name()}
    out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    out["critic_engine"] = EngineRegistry.get_engine_cls("value_model", "fsdp2").__name__
    out["replica"] = get_rollout_replica_class("hf").__name__
    out["adapter"] = get_rollout_class("hf", "async").__name__
    out["peak_rss_gb"] = get_torch_device().max_memory_allocated() / 2**30
    initialize_global_process_group_ray()
    out["backend"] = dist.get_backend()
    dist.destroy_process_group()
    print(json.dumps(out))
    """
)


def probe(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    ranks = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return subprocess.run([sys.executable, "-c", PROBE], env={**base, **ranks, **env}, capture_output=True, text=True, timeout=300)


def test_a_cpu_process_gets_the_cpu_platform_gloo_the_fsdp_engines_and_the_hf_engine() -> None:
    result = probe(CPU_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["device"] == "cpu" and out["backend"] == "gloo"
    assert out["ray_resource"] == "GPU", "verl 0.9.1 counts only GPU or NPU when it sizes the cluster"
    assert (out["engine"], out["critic_engine"]) == ("FSDPEngineWithLMHead", "FSDPEngineWithValueHead")
    assert (out["replica"], out["adapter"]) == ("HFReplica", "HFServerAdapter")
    assert 0.05 < out["peak_rss_gb"] < 64, "memory figures are the process's real peak RSS"


def test_without_our_module_verls_process_group_cannot_start_on_cpu() -> None:
    result = probe({"VERL_PLATFORM": "cpu"})
    assert result.returncode != 0
    assert "Unknown platform 'cpu'" in result.stderr, "verl knows no cpu platform of its own"
