"""Why a tick could not observe, said once: the MetricsAvailable condition and a Warning Event.

Contract: `report_unavailable(rest, body, reason, message)` sets the SpecDeployment's
MetricsAvailable condition to False with `reason` and `message` (the caller names the field,
the URL and what is allowed or what failed) and posts a Warning Event with the same reason
and message, but only when the condition did not already say False for that reason: an
outage that lasts an hour is one Event, not one per tick, while status keeps the latest
message. The next tick that observes sets the condition back (status.tick_status).

Reasons: `PrometheusUrlNotAllowed` (the operator never fetched it: url_policy.py),
`PrometheusUnavailable` (the query failed: down, refused, timed out, or an answer that is not
Prometheus').
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specpilot.operator.api.names import API_VERSION, PLURAL
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.status import post_event, set_condition, write_status

CONDITION = "MetricsAvailable"
NOT_ALLOWED = "PrometheusUrlNotAllowed"
UNAVAILABLE = "PrometheusUnavailable"


def report_unavailable(rest: KubeRest, body: Mapping[str, Any], reason: str, message: str) -> None:
    meta = body["metadata"]
    latest = rest.get(API_VERSION, PLURAL, meta["namespace"], meta["name"]) or dict(body)
    status: dict[str, Any] = dict(latest.get("status") or {})
    conditions = status.get("conditions") or []
    old = next((c for c in conditions if c.get("type") == CONDITION), None)
    told = old is not None and old.get("status") == "False" and old.get("reason") == reason
    status["conditions"] = set_condition(
        conditions, type_=CONDITION, status=False, reason=reason, message=message,
        generation=latest["metadata"].get("generation"),
    )  # fmt: skip
    write_status(rest, latest, status)
    if not told:
        post_event(rest, latest, "Warning", reason, message)
