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
