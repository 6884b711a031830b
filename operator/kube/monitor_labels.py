"""Extra labels on the engine PodMonitors/ServiceMonitors the operator creates.

Contract: `monitor_labels(env)` reads `MONITOR_LABELS_ENV`, a JSON object of label keys to
values that the operator's installer sets (the Helm chart writes it from `monitoring.labels` and
`monitoring.prometheusRelease`), and returns it as a dict; unset or empty is no labels. A value
that is not such an object, or a key or value Kubernetes would refuse, is a `ConfigError`
naming the variable, the value and what is allowed: `specpilot operator` reads it once at start
(`configured_monitor_labels`), so a bad install fails at once in one line instead of on every
reconcile. Why an environment variable: Prometheus Operator installs select monitors by label
(kube-prometheus-stack: `release: <its release>`), which is the cluster's setting, not any one
SpecDeployment's.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping

from specpilot.operator.api.pod import LABEL_VALUE, QUALIFIED_NAME
from specpilot.tuner import ConfigError

MONITOR_LABELS_ENV = "SPECPILOT_MONITOR_LABELS"
ALLOWED = 'a JSON object of label keys to label values, e.g. {"release": "kube-prometheus-stack"}'


def monitor_labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    raw = (os.environ if env is None else env).get(MONITOR_LABELS_ENV, "").strip()
    if not raw:
        return {}
    try:
        labels = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(MONITOR_LABELS_ENV, raw, ALLOWED, str(exc)) from None
    if not isinstance(labels, dict):
        raise ConfigError(MONITOR_LABELS_ENV, raw, ALLOWED)
    for key, value in labels.items():
        if len(key) > 316 or not re.fullmatch(QUALIFIED_NAME, key):
            raise ConfigError(MONITOR_LABELS_ENV, key, f"label keys matching {QUALIFIED_NAME}")
        if not isinstance(value, str) or len(value) > 63 or not re.fullmatch(LABEL_VALUE, value):
            raise ConfigError(
                f"{MONITOR_LABELS_ENV}[{key}]", value, "a label value of at most 63 characters"
            )
    return dict(sorted(labels.items()))


@functools.cache
def configured_monitor_labels() -> dict[str, str]:
    """This process's labels, read once (the environment of a running operator is fixed)."""
    return monitor_labels()
