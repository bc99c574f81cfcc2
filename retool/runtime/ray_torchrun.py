"""Run one torchrun per node of a Ray cluster: multi-node SFT inside a RayJob.

verl 0.6.1's SFT trainer (``verl.trainer.fsdp_sft_trainer``) is a torchrun program; it has no
Ray driver. A RayJob, however, runs its entrypoint once, on the head. This launcher bridges the
two: it reserves one bundle of ``devices-per-node`` devices on each of ``nodes`` distinct nodes
(a STRICT_SPREAD placement group, so every node gets exactly one torchrun), asks the first
bundle's node for its IP as the rendezvous master, then starts ``torchrun --nnodes N
--node_rank i --master_addr <ip>`` in every bundle and waits for all of them. Ray forwards each
node's output to the job log; the exit status is the first failure, or 0.

    python -m retool.runtime.ray_torchrun --nodes 2 --devices-per-node 8 --device-resource GPU \\
        -- -m verl.trainer.fsdp_sft_trainer data.train_files=... ...
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

FORWARDED_ENV_PREFIXES = ("RETOOL_", "MLFLOW_", "VLLM_", "HCCL_", "TASK_QUEUE_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "TRITON_", "PYTHON", "HF_", "NCCL_", "AWS_")
"""Driver environment passed to every node's torchrun (other nodes' processes inherit their raylet's)."""


def torchrun_argv(*, python: str, nodes: int, devices_per_node: int, node_rank: int, master_addr: str, port: int, program: Sequence[str]) -> list[str]:
    """The torchrun command of one node (static rendezvous on the master's address)."""
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node_rank {node_rank} is outside 0..{nodes - 1}")
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc_per_node={devices_per_node}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={port}",
        *program,
    ]  # fmt: skip


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def bundle_resources(device_resource: str, devices_per_node: int) -> dict[str, float]:
    """One node's bundle: its devices and a CPU for the torchrun agent."""
    return {"CPU": 1, device_resource: devices_per_node}


def first_failure(statuses: Sequence[int]) -> int:
    return next((s for s in statuses if s != 0), 0)


class NodeRunner:
    """A Ray actor pinned to one bundle: reports its node's IP and runs that node's torchrun."""

    def ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def run(self, argv: list[str], env: dict[str, str]) -> int:
        return subprocess.run(argv, env={**os.environ, **env}, check=False).returncode


def launch(*, nodes: int, devices_per_node: int, device_resource: str, port: int, program: Sequence[str], environ: Mapping[str, str]) -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=environ.get("RAY_ADDRESS", "auto"))
    group = placement_group([bundle_resources(device_resource, devices_per_node)] * nodes, strategy="STRICT_SPREAD")
    ray.get(group.ready())
    device_options = {"num_gpus": devices_per_node} if device_resource == "GPU" else {"resources": {device_resource: devices_per_node}}
    actor_cls = ray.remote(num_cpus=1, **device_options)(NodeRunner)
    runners = [actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote() for i in range(nodes)]
    master = ray.get(runners[0].ip.remote())
    log.info("torchrun on %d nodes, master %s:%d", nodes, master, port)
    env = forwarded_env(environ)
    python = sys.executable
    futures = [
        runner.run.remote(
            torchrun_argv(python=python, nodes=nodes, devices_per_node=devices_per_node, node_rank=rank, master_addr=master, port=port, program=program), env
        )
        for rank, runner in enumerate(runners)
    ]
    return first_failure(ray.get(futures))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m retool.runtime.ray_torchrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--devices-per-node", type=int, required=True)
    parser.add_argument("--device-resource", default="GPU", help="Ray resource of a device: GPU, or NPU on Ascend")
    parser.add_argument("--port", type=int, default=29500, help="rendezvous port on the master node")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="after --: what torchrun runs, e.g. -m verl.trainer.fsdp_sft_trainer k=v ...")
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("nothing to run: give the torchrun program after --")
    if args.nodes < 1 or args.devices_per_node < 1:
        parser.error("--nodes and --devices-per-node must be at least 1")
    args.program = program
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return launch(
        nodes=args.nodes, devices_per_node=args.devices_per_node, device_resource=args.device_resource, port=args.port, program=args.program, environ=os.environ
    )


if __name__ == "__main__":
    sys.exit(main())
