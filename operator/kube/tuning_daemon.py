"""One tuning tick for one SpecDeployment: observe -> decide -> act, recommend, or stay pinned.

Contract: `tune(rest, body, now=...)` runs at most one tick per `spec.tuning.intervalSeconds`
per object (the kopf daemon calls it more often; it returns None when not due, when the spec is
invalid, or when tuning is off: the config is pinned). A tick
- restores the tuner state from status (state_store), observes the main pods over a window
  (direct scrape with httpx, or PromQL against `tuning.metrics.prometheusUrl`),
- mode auto: runs `ControlLoop.tick` with the Kubernetes actuator (operator/kube/actuator.py:
  patch the pod template, follow the rollout, canary when asked; a failed rollout or a goodput
  shortfall is rolled back by the loop and the config backed off, persisted as `failed`);
  the intended config and phase Switching are written BEFORE the rollout, so a reconcile
  running meanwhile renders the same template and never reverts a switch;
- mode recommend: decides without acting; a different config goes to status.recommendation
  and an Event, the running config and its restart history stay;
- writes status.lastDecision, observed, regime, currentConfig, tunerState and the
  MetricsAvailable condition, posts one Event per decision and records operator metrics.
A `prometheusUrl` outside `url_policy` (the installer's allow-list, operator/kube/url_policy.py)
is never fetched, and a Prometheus that cannot be queried ends the tick without a decision; both
set MetricsAvailable False with the reason and post one Warning Event per outage
(operator/kube/metrics_condition.py), and the next tick tries again.
A SpecDeployment deleted mid-switch stops the tick at its next announcement (`Stopping`: no
rollback recreates the Deployment the garbage collector took).
The actuator is built by `make_actuator` (injectable for tests); every wait inside a tick
(the observation window, rollout polling) goes through `sleep`, which the operator makes
raise when it stops, so a tick never holds a shutdown or a peering hand-over. The loops
(their goodput check in flight) are an in-memory cache keyed by object; everything else is
read back from status each tick, so a restarted or failed-over operator continues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from specpilot.operator.api.names import API_VERSION, PLURAL
from specpilot.operator.api.spec import SpecDeploymentSpec, SpecError, config_to_status, decode_spec
from specpilot.operator.kube import exported_metrics
from specpilot.operator.kube.actuator import for_spec
from specpilot.operator.kube.client import KubeRest, now_iso
from specpilot.operator.kube.metrics_condition import NOT_ALLOWED, UNAVAILABLE, report_unavailable
from specpilot.operator.kube.persisted_state import InFlight, dump_state, load_rollout, load_state
from specpilot.operator.kube.pod_metrics import PodWindowSource, PrometheusSource, ScrapeSource
from specpilot.operator.kube.resume import Resumed, resume
from specpilot.operator.kube.retry import with_retries
from specpilot.operator.kube.status import EVENT_REASONS, post_event, tick_status, write_status
from specpilot.operator.kube.url_policy import FIELD as URL_FIELD
from specpilot.operator.kube.url_policy import UrlAllowList
from specpilot.operator.loop import (
    Actuator,
    ControlLoop,
    TickRecord,
    TrialActuator,
    TrialJudge,
)
from specpilot.runtime.promql import PromQLError, PromQLReader
from specpilot.tuner import (
    DEFAULT_MAX_BATCH,
    Decision,
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    decide,
)

logger = logging.getLogger(__name__)
Obj = dict[str, Any]
Sleep = Callable[[float], None]
ActuatorFactory = Callable[[KubeRest, Obj, SpecDeploymentSpec, Sleep], Actuator]
WINDOW_FRACTION = 0.8
"""Share of the interval spent observing (the rest is deciding and writing)."""
GOODPUT_TOLERANCE = 0.25
"""A switch whose first window measures this much below its prediction is rolled back."""
ENGINE_START_S = 60.0
"""An engine's start (model load) the tuner assumes before any was seen: TunerSettings'
default."""
DEFAULT_PROFILE = "llama-3.1-8b"
"""The prior's model profile when the spec names none (learning corrects the scale)."""


class Stopping(BaseException):
    """kopf asked the daemon to stop (operator exit, peering pause, object deletion); raised by
    the `sleep` a tick waits through. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on its way out (above all the loop's, which rolls a failed switch back
    and backs the config off) reads a stop as a failed rollout: the rollout in flight is left
    as it is, and status already names the config it rolls out to (`_Announcing`)."""


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()
_loops: dict[tuple[str, str], ControlLoop] = {}
_last_tick: dict[tuple[str, str], float] = {}


def object_lock(namespace: str, name: str) -> threading.Lock:
    """One lock per SpecDeployment, shared by reconcile and tuning in this process."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def forget(namespace: str, name: str) -> None:
    for cache in (_loops, _last_tick):
        cache.pop((namespace, name), None)


def settings_for(spec: SpecDeploymentSpec) -> TunerSettings:
    # latency and goodput keep to the SLO; throughput counts every token whatever its latency
    with_slo = spec.tuning.objective != "throughput"
    tpot, ttft = spec.tuning.slo_tpot_p95_ms, spec.tuning.slo_ttft_p95_ms
    return TunerSettings(
        candidates=spec.candidates,
        objective=spec.tuning.objective,
        min_dwell_s=float(spec.tuning.min_dwell_s),
        restart_downtime_s=serving_lost_per_switch_s(spec),
        rollout_share=serving_share_in_rollout(spec),
        restart_budget_per_hour=spec.tuning.restart_budget_per_hour,
        slo_tpot_p95_s=tpot / 1e3 if with_slo and tpot is not None else None,
        slo_ttft_p95_s=ttft / 1e3 if with_slo and ttft is not None else None,
        window_s=float(spec.tuning.interval_s),
        max_batch=spec.max_batch or DEFAULT_MAX_BATCH,
        # the catalog GPU's KV capacity at vLLM's default memory utilisation: an estimate
        kv_capacity_tokens=cost_for(spec).kv_capacity_tokens(),
        # trials on a canary only when asked for (tuning.explore): in the bench's ablations
        # they paid for themselves in no world
        exploration=1.0 if spec.tuning.explore else 0.0,
    )


def serving_lost_per_switch_s(spec: SpecDeploymentSpec) -> float:
    """Seconds of full serving a switch loses: none with a surge rollout (maxUnavailable 0: new
    pods start beside the old ones; the requests in flight on a stopped pod are the switch
    cost's recompute term); else one engine start, spread over the replicas (each pod, or
    maxUnavailable of them at a time, is down for a start while the others serve)."""
    if spec.tuning.max_unavailable == 0:
        return 0.0
    return ENGINE_START_S


def serving_share_in_rollout(spec: SpecDeploymentSpec) -> float:
    """The share of the replicas serving while a rollout runs: all with a surge
    (maxUnavailable 0), else those not stopped at once. Unknown replicas (left to an
    autoscaler) count as all serving: the tuner cannot tell how many there will be."""
    unavailable, replicas = spec.tuning.max_unavailable, spec.replicas
    if unavailable == 0 or not replicas:
        return 1.0
    return max(replicas - unavailable, 0) / replicas


def cost_for(spec: SpecDeploymentSpec) -> StepCost:
    return StepCost.for_hardware(spec.gpu.type, spec.gpu.model_profile or DEFAULT_PROFILE)


def metrics_source(spec: SpecDeploymentSpec, namespace: str, sleep: Sleep) -> PodWindowSource:
    if spec.tuning.metrics_source == "prometheus" and spec.tuning.prometheus_url:
        reader = PromQLReader(spec.tuning.prometheus_url, selector=f'namespace="{namespace}"')
        return PrometheusSource(reader=reader, settle_s=5.0, sleep=sleep)
    return ScrapeSource(sleep=sleep)


def kube_actuator(rest: KubeRest, body: Obj, spec: SpecDeploymentSpec, sleep: Sleep) -> Actuator:
    """The Kubernetes actuator (operator/kube/actuator.py) over this operator's REST client;
    rollout Events go to the SpecDeployment; every wait goes through `sleep` (the kopf daemon's
    stop flag interrupts it)."""
    meta = body["metadata"]
    return for_spec(
        api=rest,
        name=meta["name"],
        namespace=meta["namespace"],
        spec=spec,
        metrics=metrics_source(spec, meta["namespace"], sleep),
        sleep=sleep,
        notify=lambda reason, message: post_event(rest, body, "Normal", reason, message),
        owner=body,  # a canary or ConfigMap made mid-switch goes with the object
    )


class _Announcing:
    """Wraps the actuator: before a rollout, persist the intended config and phase Switching
    (or RollingBack), so a concurrent reconcile renders the same template."""

    def __init__(self, inner: Actuator, on_apply: Callable[[SpecConfig, bool], None]) -> None:
        self._inner, self._on_apply = inner, on_apply

    def apply(self, config: SpecConfig) -> None:
        self._on_apply(config, False)
        self._inner.apply(config)

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        self._on_apply(config, True)
        if isinstance(self._inner, TrialActuator):
            self._inner.apply_trial(config, judge)
        else:
            self._inner.apply(config)

    def canary_share(self) -> float | None:
        return self._inner.canary_share() if isinstance(self._inner, TrialActuator) else None

    def trial_observation(self) -> Observation | None:
        return self._inner.trial_observation() if isinstance(self._inner, TrialActuator) else None

    def observe(self, window_s: float) -> Observation:
        return self._inner.observe(window_s)


@dataclass(frozen=True, slots=True)
class TickOutcome:
    action: str
    reason: str
    decision: Decision
    applied: bool
    status: Obj


def tune(
    rest: KubeRest,
    body: Mapping[str, Any],
    *,
    now: float | None = None,
    make_actuator: ActuatorFactory = kube_actuator,
    sleep: Sleep = time.sleep,
    url_policy: UrlAllowList | None = None,
) -> TickOutcome | None:
    """`url_policy` defaults to the environment's allow-list (url_policy.ALLOW_ENV)."""
    now = time.time() if now is None else now
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    key = (namespace, name)
    fresh = rest.get(API_VERSION, PLURAL, namespace, name)
    if fresh is None:
        return None
    try:
        spec = decode_spec(fresh.get("spec") or {})
    except SpecError:
        return None  # reconcile reports it (Degraded); nothing to tune
    if spec.tuning.mode == "off" or now - _last_tick.get(key, 0.0) < spec.tuning.interval_s:
        return None
    _last_tick[key] = now
    url = spec.tuning.prometheus_url if spec.tuning.metrics_source == "prometheus" else None
    policy = UrlAllowList.configured() if url_policy is None else url_policy
    if url is not None and not policy.allows(url):
        report_unavailable(rest, fresh, NOT_ALLOWED, policy.refusal(url))
        return None
    try:
        return _tick(rest, fresh, spec, now, make_actuator, sleep)
    except PromQLError as exc:
        why = f"{URL_FIELD} {url!r} cannot be queried; the tuner waits for it: {exc}"
        report_unavailable(rest, fresh, UNAVAILABLE, why)
        return None


def _tick(
    rest: KubeRest,
    fresh: Obj,
    spec: SpecDeploymentSpec,
    now: float,
    make_actuator: ActuatorFactory,
    sleep: Sleep,
) -> TickOutcome:
    meta = fresh["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    key = (namespace, name)
    status: Obj = dict(fresh.get("status") or {})
    state, failed = load_state(status, spec, now)
    window = max(1.0, spec.tuning.interval_s * WINDOW_FRACTION)
    actuator = make_actuator(rest, fresh, spec, sleep)

    inflight = load_rollout(status)
    if inflight is not None:  # an earlier operator's rollout: see it through first

        def announce_back(
            flight: InFlight, intended: TunerState, backed_off: Mapping[SpecConfig, float]
        ) -> None:
            _announce(rest, fresh, status, flight, intended, backed_off, sleep)

        resumed = resume(actuator, inflight, state, failed, now, announce_back)
        _loops.pop(key, None)  # its goodput check, if any, was for another window
        return _resumed(rest, fresh, resumed)

    def announce(config: SpecConfig, trial: bool) -> None:
        rolling_back = config == state.current or (loop is not None and loop.rolling_back)
        # the switch counts against the dwell and the restart budget from now, even if this
        # operator dies before the tick ends (a rollback restarts the dwell, not the budget)
        restarts = state.restarts if rolling_back else (*state.restarts, now)
        intended = replace(state, current=config, since_s=now, restarts=restarts)
        backed_off = loop._failed if loop is not None and rolling_back else failed
        flight = InFlight(config, state.current, rolling_back, now, trial and not rolling_back)
        _announce(rest, fresh, status, flight, intended, backed_off, sleep)

    loop: ControlLoop | None = None
    if spec.tuning.mode == "auto":
        loop = _loops.get(key)
        if loop is None or loop.state.to_json() != state.to_json():
            loop = ControlLoop(
                actuator=actuator, settings=settings_for(spec), cost=cost_for(spec),
                state=state, window_s=window, goodput_tolerance=GOODPUT_TOLERANCE,
                probe_first_window=True, _failed=dict(failed),
            )  # fmt: skip
            _loops[key] = loop
        loop.actuator = _Announcing(actuator, announce)
        loop.settings, loop.window_s = settings_for(spec), window
        record = loop.tick(now)
        loop.history.clear()  # status keeps the record; a cached loop's list grew every tick
        new_state, new_failed = loop.state, dict(loop._failed)
        outcome = _auto_outcome(record)
    else:
        observation = actuator.observe(window)
        decision, learned = decide(observation, state, settings_for(spec), cost_for(spec), now)
        new_state = replace(
            learned, current=state.current, since_s=state.since_s, restarts=state.restarts
        )
        new_failed = failed
        action = "recommend" if decision.config != state.current else "stay"
        record = TickRecord(now, observation, decision, applied=False)
        outcome = (action, decision.reason, "Normal")
    action, reason, event_type = outcome
    latest = rest.get(API_VERSION, PLURAL, namespace, name) or fresh
    # the phase a rollout of this tick announced (it is seen through by now): tick_status ends it
    phase = (latest.get("status") or {}).get("phase", status.get("phase"))
    status = tick_status({**status, "phase": phase}, spec, record, new_state, action, fresh)
    status["tunerState"] = dump_state(new_state, new_failed)
    write_status(rest, latest, {**(latest.get("status") or {}), **status})
    post_event(rest, fresh, event_type, EVENT_REASONS[action], reason)
    obs = record.observation
    exported_metrics.record_config(namespace, name, new_state.current)
    exported_metrics.record_tick(
        namespace, name, action=action, regime=record.decision.regime,
        tokens_per_s=obs.generation_tokens_per_s, switched=record.applied and not
        record.rolled_back, predicted_gain=record.decision.predicted_gain,
    )  # fmt: skip
    return TickOutcome(action, reason, record.decision, record.applied, status)


def _announce(
    rest: KubeRest,
    fresh: Obj,
    status: Obj,
    flight: InFlight,
    intended: TunerState,
    failed: Mapping[SpecConfig, float],
    sleep: Sleep,
) -> None:
    """Before a rollout: phase, the config it rolls out to and the rollout in flight, so a
    concurrent reconcile renders the same template and a later operator can see it through."""
    phase = "RollingBack" if flight.rolling_back else "Switching"
    announced = {**status, "phase": phase, "currentConfig": config_to_status(flight.config),
                 "tunerState": dump_state(intended, failed, flight)}  # fmt: skip
    meta = fresh["metadata"]

    def write() -> None:
        if rest.get(API_VERSION, PLURAL, meta["namespace"], meta["name"]) is None:
            # deleted mid-switch: its children went with it; recreating them would leak
            raise Stopping(f"SpecDeployment {meta['namespace']}/{meta['name']} was deleted")
        write_status(rest, fresh, announced)

    # a 503 here must not read as the engine refusing the config (the loop would back it off)
    with_retries(write, sleep=sleep)


def _resumed(rest: KubeRest, fresh: Obj, resumed: Resumed) -> TickOutcome:
    meta = fresh["metadata"]
    config = resumed.state.current
    decision = Decision(
        action="switch" if config.speculative else "off", config=config,
        reason=resumed.reason, predicted_gain=0.0, regime="unknown",
    )  # fmt: skip
    out: Obj = {
        "phase": "Running",
        "currentConfig": config_to_status(config),
        "tunerState": dump_state(resumed.state, resumed.failed),
        "lastDecision": {"action": resumed.action, "reason": resumed.reason,
                         "predictedGain": 0.0, "config": config.describe(), "time": now_iso()},
    }  # fmt: skip
    latest = rest.get(API_VERSION, PLURAL, meta["namespace"], meta["name"]) or fresh
    write_status(rest, latest, {**(latest.get("status") or {}), **out})
    post_event(rest, fresh, resumed.event_type, EVENT_REASONS[resumed.action], resumed.reason)
    exported_metrics.record_config(meta["namespace"], meta["name"], config)
    return TickOutcome(resumed.action, resumed.reason, decision, True, out)


def _auto_outcome(record: TickRecord) -> tuple[str, str, str]:
    if record.rolled_back:
        return "rollback", record.decision.reason, "Warning"
    if record.error is not None:
        why = f"{record.decision.reason}; rolled back: {record.error}"
        return "error", why, "Warning"
    return record.decision.action, record.decision.reason, "Normal"
