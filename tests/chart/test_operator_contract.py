"""The chart's operator ConfigMap is read by the operator's own settings class, for every profile."""

from __future__ import annotations

import os

import pytest

from retool_operator.config import OperatorConfig
from tests.chart.helm import operator_config
from tests.chart.profiles import PROFILES

PREFIX = "RETOOL_OPERATOR_"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_key_is_an_operator_setting_and_parses(rendered, profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = operator_config(rendered(profile))
    unknown = [k for k in data if not k.startswith(PREFIX) or k.removeprefix(PREFIX).lower() not in OperatorConfig.model_fields]
    assert unknown == []
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    config = OperatorConfig()
    assert config.webhook_enabled is (data[f"{PREFIX}WEBHOOK_ENABLED"] == "true")
    assert config.namespace_list == [n for n in data[f"{PREFIX}NAMESPACES"].split(",") if n]
    assert ",".join(f"{k}={v}" for k, v in config.ascend_selector.items()) == data[f"{PREFIX}ASCEND_NODE_SELECTOR"]


def test_storage_class_and_batch_scheduler_reach_the_operator(chart, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.chart.helm import render

    data = operator_config(render(chart, "--set", "defaults.storageClassName=cephfs", "--set", "defaults.batchScheduler=volcano"))
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    config = OperatorConfig()
    assert (config.default_storage_class, config.batch_scheduler) == ("cephfs", "volcano")


def test_an_unknown_batch_scheduler_is_refused_by_the_values_schema(chart) -> None:
    from tests.chart.helm import HelmError, render

    with pytest.raises(HelmError, match="batchScheduler"):
        render(chart, "--set", "defaults.batchScheduler=kai")


def _config_of(data: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> OperatorConfig:
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    return OperatorConfig()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--kube-version", "1.32.0"), False),  # UserNamespacesSupport: beta but off by default in 1.30-1.32
        (("--kube-version", "1.33.0"), True),  # on by default from 1.33
        (("--kube-version", "1.36.1"), True),
        (("--kube-version", "1.33.0", "--set", "defaults.sandboxUserNamespaces.enabled=false"), False),
        (("--kube-version", "1.31.0", "--set", "defaults.sandboxUserNamespaces.enabled=true"), True),
    ],
    ids=[
        "auto is off on 1.32, where the feature gate is off by default",
        "auto is on from 1.33, where the feature gate is on by default",
        "auto stays on for later releases",
        "false turns it off on any version",
        "true turns it on where the administrator enabled the gate",
    ],
)
def test_sandbox_user_namespaces_follow_the_kubernetes_version_unless_forced(chart, flags: tuple[str, ...], expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.chart.helm import render

    config = _config_of(operator_config(render(chart, *flags)), monkeypatch)
    assert config.sandbox_user_namespaces is expected
    assert config.sandbox_sys_admin is True


def test_sandbox_sys_admin_can_be_left_out_for_baseline_namespaces(chart, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.chart.helm import render

    config = _config_of(operator_config(render(chart, "--kube-version", "1.33.0", "--set", "defaults.sandboxUserNamespaces.sysAdmin=false")), monkeypatch)
    assert (config.sandbox_user_namespaces, config.sandbox_sys_admin) == (True, False)


def test_a_misspelled_user_namespace_mode_is_refused_by_the_values_schema(chart) -> None:
    from tests.chart.helm import HelmError, render

    with pytest.raises(HelmError, match="sandboxUserNamespaces"):
        render(chart, "--set", "defaults.sandboxUserNamespaces.enabled=yes")


def test_the_operator_knows_its_own_pods_so_sandbox_policies_admit_exactly_them(chart, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox NetworkPolicy's operator rule selects the chart's operator pods by namespace and labels."""
    from tests.chart.helm import NAMESPACE, one, render

    docs = render(chart)
    config = _config_of(operator_config(docs), monkeypatch)
    assert config.own_pods is not None
    namespace, labels = config.own_pods
    pod_labels = one(docs, "Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    assert namespace == NAMESPACE
    assert labels.items() <= pod_labels.items()
    mlflow_labels = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment" and not d["metadata"]["name"].endswith("-operator")]
    assert not any(labels.items() <= other.items() for other in mlflow_labels)  # no other pod of the release matches
