"""The installer's labels for the engine monitors (SPECPILOT_MONITOR_LABELS): read as the chart
writes them, refused in one line naming the variable when Kubernetes would refuse them, and on
every engine monitor the operator renders (tests/operator/test_monitoring.py follows them from
the chart's values to the PodMonitor)."""

from __future__ import annotations

import pytest

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.children import desired_children
from specpilot.operator.kube.monitor_labels import MONITOR_LABELS_ENV, monitor_labels
from specpilot.tuner import ConfigError


def test_unset_or_empty_is_no_labels() -> None:
    assert monitor_labels({}) == {}
    assert monitor_labels({MONITOR_LABELS_ENV: " "}) == {}


def test_a_json_object_is_the_labels() -> None:
    env = {MONITOR_LABELS_ENV: '{"team": "inference", "release": "kps"}'}
    assert monitor_labels(env) == {"release": "kps", "team": "inference"}


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("release=kps", MONITOR_LABELS_ENV),
        ('["release"]', MONITOR_LABELS_ENV),
        ('{"bad key!": "x"}', "'bad key!'"),
        ('{"release": 3}', f"{MONITOR_LABELS_ENV}[release]"),
        ('{"release": "not a label value"}', f"{MONITOR_LABELS_ENV}[release]"),
    ],
)
def test_bad_labels_are_one_error_naming_the_variable(raw: str, named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        monitor_labels({MONITOR_LABELS_ENV: raw})
    message = str(raised.value)
    assert named in message and "\n" not in message, message


def test_the_monitor_in_the_children_carries_the_configured_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specpilot.operator.kube import monitor_labels as module

    monkeypatch.setenv(MONITOR_LABELS_ENV, '{"release": "kps"}')
    module.configured_monitor_labels.cache_clear()
    try:
        spec = decode_spec({"engine": "vllm", "model": "org/m"})
        children = desired_children(
            name="x", namespace="ns", spec=spec, config=spec.initial, monitor_kind="PodMonitor"
        )
        (monitor,) = [c for c in children if c["kind"] == "PodMonitor"]
        assert monitor["metadata"]["labels"]["release"] == "kps"
        # the Deployment's and Service's labels are SpecPilot's alone
        for child in children:
            if child["kind"] != "PodMonitor":
                assert "release" not in child["metadata"]["labels"]
    finally:
        module.configured_monitor_labels.cache_clear()
