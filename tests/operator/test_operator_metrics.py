"""The operator's own metrics, read back through prometheus_client's text exposition."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specpilot.operator.kube import exported_metrics as om
from specpilot.tuner import SpecConfig


def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(om.REGISTRY).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": "metrics", "name": "m", **extra}.items()))


def test_a_switch_reports_predicted_then_realized_gain_regime_and_config() -> None:
    key = labels()
    om.record_config("metrics", "m", SpecConfig(method="ngram", num_speculative_tokens=3))
    om.record_tick(
        "metrics", "m", action="switch", regime="memory-bound", tokens_per_s=1000.0,
        switched=True, predicted_gain=0.2,
    )  # fmt: skip
    first = samples()
    assert first["specpilot_predicted_gain_ratio", key] == 0.2
    assert ("specpilot_realized_gain_ratio", key) not in first  # nothing measured after yet
    assert first["specpilot_decisions_total", labels(action="switch")] == 1
    assert first["specpilot_regime", labels(regime="memory-bound")] == 1
    assert first["specpilot_regime", labels(regime="compute-bound")] == 0
    info = [labels for (name, labels) in first if name == "specpilot_current_config_info"]
    assert labels(description="ngram K=3", k="3", method="ngram") in info
    assert 0 <= first["specpilot_observation_age_seconds", key] < 60

    om.record_tick(
        "metrics", "m", action="stay", regime="transition", tokens_per_s=1100.0,
        switched=False, predicted_gain=0.0,
    )  # fmt: skip
    second = samples()
    assert abs(second["specpilot_realized_gain_ratio", key] - 0.1) < 1e-9
    assert second["specpilot_predicted_gain_ratio", key] == 0.2  # the last switch's prediction
    assert second["specpilot_regime", labels(regime="transition")] == 1

    om.forget("metrics", "m")
    assert not [n for (n, labels) in samples() if ("namespace", "metrics") in labels]
