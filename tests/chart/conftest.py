"""Fixtures of the chart tests: the helm binary, an offline copy of the chart, a real CA."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.chart.helm import HELM, chart_copy


@pytest.fixture(scope="session")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert HELM.is_file(), f"{HELM} is missing: run `make helm` (make test does it first)"
    return chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="session")
def ca_bundle() -> str:
    """base64 PEM of a freshly generated self-signed CA, as an administrator would pass it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "retool-webhook-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()


@pytest.fixture(scope="session")
def rendered(chart: Path, ca_bundle: str):
    """profile name -> rendered objects, each profile rendered once per session."""
    from tests.chart.profiles import render_profile

    cache: dict[str, list[dict]] = {}

    def get(name: str) -> list[dict]:
        if name not in cache:
            cache[name] = render_profile(chart, name, ca_bundle)
        return cache[name]

    return get
