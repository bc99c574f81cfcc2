from decimal import Decimal

import pytest

from retool.spec.model import RetoolRunSpec
from retool.spec.names import MAX_RAYJOB_NAME_LENGTH, max_run_name_length, run_name_problems, sandbox_name, stage_child_name
from retool.spec.quantity import parse_quantity
from retool.spec.rules import sandbox_replicas


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Decimal("0.5")),
        ("4", Decimal(4)),
        (8, Decimal(8)),
        ("16Gi", Decimal(16 * 2**30)),
        ("1.5G", Decimal("1.5e9")),
        ("1e3", Decimal(1000)),
        ("128974848", Decimal(128974848)),
        ("129M", Decimal(129 * 10**6)),
        ("123Mi", Decimal(123 * 2**20)),
        (".5Ki", Decimal(512)),
    ],
    ids=lambda v: str(v),
)
def test_quantities_parse_like_kubernetes(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["4Gx", "", "Gi", "1.2.3", "ten", "1 Gi", "0x10"])
def test_malformed_quantities_are_rejected(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("max_concurrent", "per_replica", "replicas"),
    [(256, 16, 16), (1, 16, 1), (16, 16, 1), (17, 16, 2), (100, 7, 15), (128, 16, 8)],
    ids=lambda v: str(v),
)
def test_sandbox_replicas_are_enough_for_max_concurrent(max_concurrent, per_replica, replicas):
    spec = RetoolRunSpec.model_validate(
        {"storage": {"pvc": {"claimName": "d"}}, "sandbox": {"maxConcurrent": max_concurrent, "perReplicaConcurrency": per_replica}}
    )
    assert sandbox_replicas(spec) == replicas


def test_child_names_are_deterministic_per_stage_and_attempt():
    assert sandbox_name("run") == "run-sandbox"
    assert stage_child_name("run", "rl", 3) == "run-rl-3"
    with pytest.raises(ValueError, match="unknown stage"):
        stage_child_name("run", "train")


def test_longest_allowed_run_name_keeps_every_rayjob_name_within_kuberay_limit():
    name = "r" * max_run_name_length()
    assert run_name_problems(name) == []
    assert len(stage_child_name(name, "eval", 10)) <= MAX_RAYJOB_NAME_LENGTH
    assert run_name_problems(name + "x")


@pytest.mark.parametrize("name", ["9lives", "Upper", "under_score", "trailing-", "dots.in.name", ""])
def test_run_names_must_be_dns1035_labels(name):
    assert any("DNS-1035" in p for p in run_name_problems(name))
