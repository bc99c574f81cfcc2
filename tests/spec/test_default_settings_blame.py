"""A device count the recipe's defaults do not fit names the field the user wrote (the device
count) and the setting to add, not a default the user never saw; a value the user wrote is still
the field to fix."""

from __future__ import annotations

import pytest

from retool.spec.validate import validate_document


def run(hardware: dict, **sections: dict) -> dict:
    return {
        "apiVersion": "retool.dev/v1alpha1",
        "kind": "RetoolRun",
        "metadata": {"name": "odd"},
        "spec": {"model": {"base": "Qwen/Qwen2.5-7B-Instruct"}, "hardware": {"accelerator": "nvidia", **hardware}, **sections},
    }


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            run({"devicesPerNode": 3}),
            [
                "spec.hardware.devicesPerNode: 3 devices in all: the default rl.sequenceParallel (8) must divide them; set spec.rl.sequenceParallel, e.g. to 3",
                "spec.hardware.devicesPerNode: 3 devices per node: the default rl.tensorParallel (4) must divide them; set spec.rl.tensorParallel, e.g. to 3",
                "spec.hardware.devicesPerNode: 3 devices in all: the default sft.sequenceParallel (4) must divide them; set spec.sft.sequenceParallel, e.g. to 3",
                "spec.hardware.devicesPerNode: batchSize x rolloutN = 512 x 16 = 8192 responses per step must be a multiple of the 3 devices"
                " (hardware.nodes x hardware.devicesPerNode): verl splits every step's responses over all of them"
                " (the defaults: set rl.batchSize or rl.rolloutN to fit the devices)",
            ],
            id="three GPUs with every default names devicesPerNode and each setting to add",
        ),
        pytest.param(
            run({"devicesPerNode": 6}, rl={"tensorParallel": 4, "sequenceParallel": 6}, sft={"sequenceParallel": 6}),
            [
                "spec.rl.tensorParallel: 4 must divide the 6 devices of one node (hardware.devicesPerNode); rollout engines do not span nodes",
                "spec.hardware.devicesPerNode: batchSize x rolloutN = 512 x 16 = 8192 responses per step must be a multiple of the 6 devices"
                " (hardware.nodes x hardware.devicesPerNode): verl splits every step's responses over all of them"
                " (the defaults: set rl.batchSize or rl.rolloutN to fit the devices)",
            ],
            id="a tensorParallel the user wrote is the field to fix",
        ),
        pytest.param(
            run({"nodes": 3}),
            [
                "spec.hardware.nodes: miniBatchSize x rolloutN = 1024 responses must split evenly over 3 data-parallel ranks (devices / rl.sequenceParallel)"
                " (the defaults: set rl.miniBatchSize, rl.rolloutN or rl.sequenceParallel to fit the devices)",
                "spec.hardware.nodes: sft.batchSize 32 must be divisible by the 6 data-parallel ranks (devices / sft.sequenceParallel)"
                " (the defaults: set sft.batchSize or sft.sequenceParallel to fit the devices)",
            ],
            id="three nodes with default batches names nodes",
        ),
        pytest.param(
            run({"nodes": 3}, rl={"miniBatchSize": 64}, sft={"batchSize": 32}),
            [
                "spec.rl.miniBatchSize: miniBatchSize x rolloutN = 1024 responses must split evenly over 3 data-parallel ranks (devices / rl.sequenceParallel)",
                "spec.sft.batchSize: sft.batchSize 32 must be divisible by the 6 data-parallel ranks (devices / sft.sequenceParallel)",
            ],
            id="batch sizes the user wrote are the fields to fix",
        ),
        pytest.param(
            run({"devicesPerNode": 6}, rl={"tensorParallel": 2, "sequenceParallel": 6, "batchSize": 448}, sft={"sequenceParallel": 6}),
            [
                "spec.rl.batchSize: batchSize x rolloutN = 448 x 16 = 7168 responses per step must be a multiple of the 6 devices"
                " (hardware.nodes x hardware.devicesPerNode): verl splits every step's responses over all of them",
            ],
            id="a batchSize the user wrote that verl cannot split over the devices is the field to fix",
        ),
    ],
)
def test_the_problem_names_the_field_the_user_wrote(document: dict, expected: list[str]) -> None:
    assert [str(p) for p in validate_document(document)] == expected
