"""spec.hardware.product against the node label values GPU feature discovery sets."""

from __future__ import annotations

import pytest

from retool.spec.products import closest_gpu_product, product_warnings
from retool.spec.validate import document_warnings, parse_run


def doc(**hardware: object) -> dict:
    return {
        "apiVersion": "retool.dev/v1alpha1",
        "kind": "RetoolRun",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"storage": {"pvc": {"claimName": "d"}}, "hardware": dict(hardware)},
    }


@pytest.mark.parametrize(
    ("product", "close"),
    [("H200", "NVIDIA-H200"), ("h100-80gb-hbm3", "NVIDIA-H100-80GB-HBM3"), ("NVIDIA H200", "NVIDIA-H200"), ("A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"), ("T4", "Tesla-T4")],
    ids=["short-name", "lower-case", "space-instead-of-dash", "without-vendor", "tesla"],
)
def test_the_closest_known_label_value_is_named(product: str, close: str) -> None:
    assert closest_gpu_product(product) == close


@pytest.mark.parametrize(
    ("hardware", "warned"),
    [
        ({}, False),
        ({"product": "NVIDIA-H200"}, False),
        ({"product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, False),
        ({"product": "NVIDIA-H100-80GB-HBM3-SHARED"}, False),
        ({"product": "H200"}, True),
        ({"product": "NVIDIA-Z9000"}, True),
        ({"accelerator": "ascend", "product": "Ascend910"}, True),
    ],
    ids=["unset", "known", "mig-profile", "time-sliced", "short-name", "unknown-gpu", "ascend-product-selects-nothing"],
)
def test_product_warnings(hardware: dict, warned: bool) -> None:
    warnings = product_warnings(parse_run(doc(**hardware)).spec)
    assert bool(warnings) is warned
    assert all(w.path == "spec.hardware.product" for w in warnings)


def test_warnings_are_not_errors_and_invalid_documents_have_none() -> None:
    assert document_warnings(doc(product="H200")) and parse_run(doc(product="H200"))
    assert document_warnings(doc(product="H200", nodes=0)) == []


def test_a_product_that_is_not_a_label_value_is_an_error() -> None:
    from retool.spec.validate import validate_document

    assert [p.path for p in validate_document(doc(product="NVIDIA H200"))] == ["spec.hardware.product"]
