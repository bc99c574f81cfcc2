"""The documented install profiles (docs/install.md "Configure"), rendered once per test session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.chart.helm import PROFILES_DIR, Profile, render

CERT_MANAGER_API = ("--api-versions", "cert-manager.io/v1")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("default"),
        Profile("default-in-cluster-with-cert-manager", flags=CERT_MANAGER_API),
        Profile("external-mlflow", ("external-mlflow-values.yaml",)),
        Profile("postgres-s3", ("postgres-s3-values.yaml",)),
        Profile("ascend", ("ascend-values.yaml",)),
        Profile("namespaced", ("namespaced-values.yaml",), CERT_MANAGER_API),
        Profile("cert-manager", ("cert-manager-values.yaml",)),
        Profile("webhook-secret", ("webhook-secret-values.yaml",)),
        Profile("webhook-off", ("webhook-off-values.yaml",), CERT_MANAGER_API),
    )
}

# Profiles whose values file needs a CA the test generates (a real admin passes `base64 -w0 ca.crt`).
NEEDS_CA_BUNDLE = {"webhook-secret"}


def profile_files() -> set[str]:
    return {p.name for p in PROFILES_DIR.glob("*-values.yaml")}


def render_profile(chart: Path, name: str, ca_bundle: str) -> list[dict[str, Any]]:
    args = PROFILES[name].args()
    if name in NEEDS_CA_BUNDLE:
        args += ["--set", f"webhook.certificates.caBundle={ca_bundle}"]
    return render(chart, *args)
