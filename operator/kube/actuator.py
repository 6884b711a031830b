"""Kubernetes actuator: the control loop's `Actuator` for one SpecDeployment's Deployment.

Contract (operator/loop.py `Actuator`, plus what rollouts need):
- `apply(config)` renders the Deployment for `config` (engine args from the adapter and the
  `specpilot.io/config` annotation, via `render`, normally children.desired_deployment),
  replaces the live Deployment's pod template with it (a JSON patch of `spec.template` only:
  replicas belong to the user or an autoscaler) and follows the rollout until every replica
  runs the new template and is available (operator/kube/rollout.py). A new pod that crash-loops or
  exits, or a rollout not done within `rollout_timeout_s`, raises `RolloutError` naming the
  pod and the engine's last words. It does NOT put the old template back itself: the loop
  catches the error, re-applies the previous config (which is this same call, so the rollback
  is followed the same way), marks the config failed and backs off. A missing Deployment is
  created. Applying the config that already runs is a cheap no-op (no patch, one status read).
- With `canary` on (or for a trial, `apply_trial`: the tuner exploring) and at least 2 main
  replicas, or one with a spare GPU (`spare_replica`), a new config first runs as a 1-replica
  `<name>-canary` Deployment (role "canary", same Service). Beside a single replica the
  trial runs at all of the load (runtime/full_load_trial.py): once the canary is Ready and
  warmed up, the Service is routed to the canary's pods only (its selector narrowed to role
  "canary"; the replica finishes what it holds and idles, warm) for `full_load_window_s`,
  read every `PROBE_S`; the canary is stopped at the probes that find it congested and
  judged on its time in system against the main pods' last window (`observe`'s), with no
  judge. Promoted, the canary serves on while the idle main pod is replaced on its own GPU
  (main scaled to 0, its count held in `CANARY_SLOT_ANNOTATION`, patched, given back); then,
  promoted or not, the Service is routed to the main pods, the canary finishes what it holds
  and is deleted, and the Service gets both roles back (`_delete_canary`, which also
  restores a Service an operator killed mid-trial left on one role). The Service routes
  connections, not requests: a client holding keep-alive connections to the main pod keeps
  sending on them until they close, so "all of the load" is all the new connections'.
  Where the SpecDeployment sets the replica count (`canary_in_place`), the canary takes one
  main replica's place, so a trial never serves on more GPUs than the config it is compared
  with: the main Deployment is scaled to N-1 (its
  count kept in `CANARY_SLOT_ANNOTATION`) once the canary is Ready with a spare GPU
  (`spare_replica`: maxSurge above 0), or before the canary starts without one; where an
  autoscaler owns the count the canary runs beside the main pods. Once Ready and warmed up
  (`canary_warmup_s`: it filled from empty), the canary pods and the main pods are observed
  over `canary_window_s` and compared per pod by per-sequence speed (tokens/s over running
  requests: the Service spreads requests evenly, so every pod generates about the same
  tokens/s whatever its speed, and speed shows in how long each request stays). The canary is
  promoted (main template patched and followed) unless it is slower than the main pods by
  more than `canary_tolerance`, or a trial's `judge` (the tuner, given the canary pods'
  window) says why not; then `CanaryRejected` is raised (the loop backs off). Either way the
  canary's slot goes back to the main Deployment (with a spare GPU its replica is Ready before
  the canary is deleted; without one the canary is deleted first), and a slot an earlier
  operator left held is given back at the next `apply`.
- `observe(window_s)` reads the Ready main pods' engine metrics over the window through a
  `PodWindowSource` (direct scrape of pod IP:port/metrics, or PromQL) and returns one
  Observation (runtime/metrics.observe); `last_canary` keeps the last per-pod comparison.
Every API call is retried on a transient failure (a 5xx, 429 or timeout: operator/kube/retry.py),
so one API hiccup while a rollout is followed is waited out; only a failure that outlasts the
retries, or the rollout itself failing, raises out of `apply` (and the loop rolls back). A
create whose first answer was lost and whose retry finds the object there (409) goes on with it.
Clock and sleep are injected (`clock`, `sleep`), so tests drive rollouts without real time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

from specpilot.operator.api.names import CANARY_SLOT_ANNOTATION, CONFIG_ANNOTATION
from specpilot.operator.api.spec import SpecDeploymentSpec
from specpilot.operator.kube.children import (
    Role,
    desired_config_map,
    desired_deployment,
    service_name,
)
from specpilot.operator.kube.client import KubeConflict
from specpilot.operator.kube.pod_metrics import PodTarget, PodWindowSource, pod_target
from specpilot.operator.kube.retry import with_retries
from specpilot.operator.kube.rollout import rollout_status
from specpilot.operator.loop import TrialJudge
from specpilot.runtime.engine_metrics import WindowStats, consecutive, observe, observe_per_pod
from specpilot.runtime.full_load_trial import PROBE_S, FullLoadTrial, in_flight, time_in_system
from specpilot.runtime.full_load_trial import WINDOW_S as FULL_LOAD_WINDOW_S
from specpilot.tuner import Observation, SpecConfig

Renderer = Callable[[SpecConfig, Role], dict[str, Any]]
"""(config, role) -> the Deployment manifest for that role."""
SidecarRenderer = Callable[[SpecConfig, Role], dict[str, Any] | None]
"""(config, role) -> the ConfigMap the Deployment mounts (SGLang's adaptive file), or None."""
Notify = Callable[[str, str], None]
"""(reason, message): one Kubernetes Event's worth, e.g. ("RolloutFailed", "...")."""


class RolloutError(RuntimeError):
    """The new pods did not become Ready: crash, image, timeout or progress deadline."""


Obj = dict[str, Any]
T = TypeVar("T")


class DeploymentApi(Protocol):
    """What the actuator needs from a cluster (`client.KubeRest` is the real one; tests pass
    a fake). A missing object reads as None; other failures raise `client.KubeApiError`."""

    def read_deployment(self, namespace: str, name: str) -> Obj | None: ...

    def create_deployment(self, namespace: str, body: Obj) -> Obj: ...

    def replace_template(self, namespace: str, name: str, template: Obj) -> Obj:
        """Replace `spec.template` only."""

    def delete_deployment(self, namespace: str, name: str) -> None: ...

    def set_replicas(self, namespace: str, name: str, replicas: int, held: int | None) -> None:
        """Set `spec.replicas`, and `CANARY_SLOT_ANNOTATION` to `held` (None removes it)."""

    def ensure_config_map(self, namespace: str, body: Obj) -> None:
        """Create the ConfigMap unless one of that name exists (its name hashes its content)."""

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]: ...

    def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Service's pod selector (None: no such Service)."""

    def set_service_selector(self, namespace: str, name: str, selector: Mapping[str, str]) -> None:
        """Route the Service to the pods `selector` picks (replacing its selector whole)."""


class CanaryRejected(RuntimeError):
    """The canary ran but was slower per pod than the main pods beyond the tolerance, had no
    load to compare, or the trial's judge said why not."""


@dataclass(frozen=True, slots=True)
class CanaryResult:
    config: SpecConfig
    canary_speed: float | None
    """Tokens/s per running request on the canary pods over the comparison window."""
    main_speed: float | None
    """The same on the main pods over the same window."""
    promoted: bool
    reason: str


@dataclass(kw_only=True)
class KubeActuator:
    api: DeploymentApi
    name: str
    namespace: str
    engine: str
    render: Renderer
    metrics: PodWindowSource
    render_sidecar: SidecarRenderer | None = None
    rollout_timeout_s: float = 900.0
    poll_s: float = 2.0
    canary: bool = False
    canary_window_s: float = 60.0
    canary_warmup_s: float = 20.0
    """How long a Ready canary serves before its window starts: it fills from empty (every
    first request's prefill at once, below the main pods' batch), which is not its config's
    speed."""
    canary_tolerance: float = 0.05
    full_load_window_s: float = FULL_LOAD_WINDOW_S
    """How long a canary beside a single replica takes all of the load (a trial at all of the
    load: runtime/full_load_trial.py)."""
    canary_in_place: bool = False
    """The canary takes one main replica's place (main scaled to N-1 while it runs): for a
    count the SpecDeployment sets. False where an autoscaler owns it: the canary runs beside."""
    spare_replica: bool = True
    """A spare GPU for a rollout (maxSurge above 0): an in-place canary starts on it before a
    main replica stops; without one the main replica stops first."""
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    notify: Notify | None = None
    config: SpecConfig | None = None
    """The config the main Deployment runs: read from it on the first `apply`, then the last
    successfully applied one."""
    last_canary: CanaryResult | None = None
    last_canary_observation: Observation | None = None
    """The canary pods' own Observation over the last comparison window (the tuner learns
    the canary's config from it: `trial_observation`)."""
    rollouts: int = 0
    """Template patches made (a rollback counts as one)."""
    last_observation: Observation | None = None
    """The main pods' last window `observe` returned: a trial at all of the load compares
    the canary with it."""

    @property
    def canary_name(self) -> str:
        return f"{self.name}-canary"

    def apply(self, config: SpecConfig) -> None:
        self._apply(config, canary=self.canary)

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        """A trial goes through the canary whether or not the spec asks for canaries: with two
        or more main replicas it runs at one replica's share of the traffic (beside a single
        replica with a spare GPU, at all of the load, the replica the way back), and one that
        disappoints raises CanaryRejected with the main pods untouched."""
        self._apply(config, canary=True, judge=judge)

    def canary_share(self) -> float | None:
        """The share of the traffic a trial's canary would take now with N >= 2 main replicas
        (the Service spreads requests evenly over the pods): 1/N in a replica's place, 1/(N+1)
        beside them; 1/2 beside a single replica with a spare GPU (the tuner's price for a
        trial that takes all of the load, stopped at its first congested probes, with a warm
        replica to take it back); None with one and no spare
        GPU (there `apply_trial` rolls the main pod at all of the traffic). An API that cannot
        tell counts as no canary: the tuner then just does not explore this window."""
        try:
            live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        except Exception:
            return None
        if live is None or not self._has_canary(_replicas(live)):
            return None
        return 1.0 / (_replicas(live) + (0 if self._in_place(_replicas(live)) else 1))

    def _has_canary(self, replicas: int) -> bool:
        """Two or more main replicas, or one with a spare GPU for a canary beside it."""
        return replicas >= 2 or (replicas == 1 and self.spare_replica)

    def _in_place(self, replicas: int) -> bool:
        """Whether the canary takes a main replica's place: never the only one's."""
        return self.canary_in_place and replicas >= 2

    def trial_observation(self) -> Observation | None:
        """The canary pods' window from the last canary comparison (None before any)."""
        return self.last_canary_observation

    def _apply(
        self,
        config: SpecConfig,
        *,
        canary: bool,
        judge: TrialJudge | None = None,
    ) -> None:
        self.last_canary_observation = None  # only a canary measured by this call taught anything
        main = self.render(config, "main")
        live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        if live is not None and _held(live) is not None:  # an earlier operator's trial
            self._give_back_slot(None)
            live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        if self.config is None and live is not None:
            self.config = _live_config(live)  # what ran before this actuator changed anything
        changes = live is None or not _same_template(live, main)
        # Going back to the config that ran (a rollback) needs no canary: it was serving.
        canary = changes and canary and config != self.config
        given_back = False
        try:
            if canary and live is not None and self._has_canary(_replicas(live)):
                try:
                    self._try_canary(config, judge, _replicas(live))
                except CanaryRejected:
                    self._give_back_slot(self._running())
                    given_back = True
                    raise
                if _replicas(live) == 1:
                    # promoted beside the only replica: the canary serves on while the idle
                    # replica is replaced on its own GPU (scaled to 0, its count held and
                    # given back below, the canary deleted once the new pod is Ready)
                    self._hold_slot(1)
            self._roll(self.name, "main", main, live, config)
            self._give_back_slot(config)
            given_back = True
        finally:
            if not given_back:  # failed or stopped mid-way: the loop's rollback follows main
                self._give_back_slot(None)
        self.config = config

    def observe(self, window_s: float) -> Observation:
        targets = self._targets(self._selector(self.render(self._running(), "main")))
        stats = self.metrics.window(self.engine, targets, window_s)
        self.last_observation = observe(self.engine, stats)
        return self.last_observation

    def _running(self) -> SpecConfig:
        if self.config is not None:
            return self.config
        live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        # Only the selector is needed from the render; any config gives the same labels.
        return (_live_config(live) if live else None) or SpecConfig()

    def _roll(
        self,
        name: str,
        role: Role,
        desired: dict[str, Any],
        live: Mapping[str, Any] | None,
        config: SpecConfig,
    ) -> None:
        sidecar = self.render_sidecar(config, role) if self.render_sidecar else None
        if sidecar is not None:  # before the template that mounts it
            self._call(lambda: self.api.ensure_config_map(self.namespace, sidecar))
        if live is None:
            try:
                self._call(lambda: self.api.create_deployment(self.namespace, desired))
                self.rollouts += 1
            except KubeConflict:  # a retried create whose first try got through, or reconcile
                live = self._call(lambda: self.api.read_deployment(self.namespace, name))
        if live is not None and not _same_template(live, desired):
            self._call(lambda: self.api.replace_template(self.namespace, name, _template(desired)))
            self.rollouts += 1
            self._notify("RolloutStarted", f"{name}: rolling out {config.describe()}")
        self._follow(name, desired, config)

    def _follow(self, name: str, desired: Mapping[str, Any], config: SpecConfig) -> None:
        config_json = _annotation(desired)
        selector = self._selector(desired)
        deadline = self.clock() + self.rollout_timeout_s
        while True:
            deployment = self._call(lambda: self.api.read_deployment(self.namespace, name))
            if deployment is None:
                raise RolloutError(f"Deployment {self.namespace}/{name} disappeared mid-rollout")
            pods = self._call(lambda: self.api.list_pods(self.namespace, selector))
            status = rollout_status(deployment, pods, config_json)
            if status.done:
                return
            if status.failed or self.clock() >= deadline:
                message = (
                    f"{name}: {config.describe()} failed to roll out: {status.message}"
                    if status.failed
                    else f"{name}: {config.describe()} not Ready within "
                    f"{self.rollout_timeout_s:.0f}s: {status.message}"
                )
                self._notify("RolloutFailed", message)
                raise RolloutError(message)
            self.sleep(self.poll_s)

    def _try_canary(self, config: SpecConfig, judge: TrialJudge | None, replicas: int) -> None:
        if replicas == 1 and self.last_observation is None:
            # nothing to hold a trial at all of the load against: no canary is started
            reason = (
                f"canary {config.describe()} rejected: no window of the replica's to compare with"
            )
            self._notify("CanaryRejected", reason)
            raise CanaryRejected(reason)
        desired = self.render(config, "canary")
        live = self._call(lambda: self.api.read_deployment(self.namespace, self.canary_name))
        in_place = self._in_place(replicas)
        if in_place and not self.spare_replica:  # no GPU for it until one stops
            self._hold_slot(replicas)
        self._roll(self.canary_name, "canary", desired, live, config)
        if in_place and self.spare_replica:
            self._hold_slot(replicas)
        self.sleep(self.canary_warmup_s)
        if replicas == 1:  # beside the only replica: measured at all of the load, no judge
            self.last_canary = result = self._at_full_load(config, desired)
            self._notify("CanaryPromoted" if result.promoted else "CanaryRejected", result.reason)
            if not result.promoted:
                raise CanaryRejected(result.reason)
            return
        result = self._compare(config, desired)
        served = self.last_canary_observation
        why_not = judge(served) if result.promoted and judge and served else None
        if why_not is not None:
            result = replace(
                result, promoted=False, reason=f"canary {config.describe()} rejected: {why_not}"
            )
        self.last_canary = result
        self._notify("CanaryPromoted" if result.promoted else "CanaryRejected", result.reason)
        if not result.promoted:
            raise CanaryRejected(result.reason)

    def _hold_slot(self, replicas: int) -> None:
        """Scale the main Deployment to one replica fewer for the canary, and wait for it."""
        self._call(lambda: self.api.set_replicas(self.namespace, self.name, replicas - 1, replicas))
        running = self._running()
        self._follow(self.name, self.render(running, "main"), running)

    def _give_back_slot(self, follow: SpecConfig | None) -> None:
        """Delete the canary and give its slot back to the main Deployment, whose pods run
        `follow` (waited for; None: not waited for, the caller's rollback follows them)."""
        live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        held = _held(live) if live is not None else None
        if held is None:
            self._delete_canary()
            return
        if not self.spare_replica:  # the canary holds the GPU the replica needs
            self._delete_canary()
        self._call(lambda: self.api.set_replicas(self.namespace, self.name, held, None))
        if follow is not None:
            self._follow(self.name, self.render(follow, "main"), follow)
        self._delete_canary()

    def _delete_canary(self) -> None:
        """Delete the canary, then give the Service back both roles' pods if a trial at all
        of the load left it routed to one (this operator's, or one killed mid-trial: a
        Service left on the canary's pods would have none once they go). A canary that has
        all of the load first sends new requests to the main pods and finishes what it
        holds, once the main pods are Ready: after an operator killed mid-promotion the main
        Deployment is only now given its pod back, and a Service routed to a pod still
        starting answers every new request with an error until it is."""
        live = self._call(lambda: self.api.service_selector(self.namespace, self._service))
        canary = self._service_selector("canary")
        if live == canary:  # it has all of the load: new requests to the replica first
            self._follow_main()
            self._route("main")
            self._drain(self._targets(canary))
        self._call(lambda: self.api.delete_deployment(self.namespace, self.canary_name))
        if live is not None and live != self._service_selector("both"):
            self._route("both")

    def _follow_main(self) -> None:
        """Wait for the main Deployment's pods to be Ready, running what its template runs."""
        live = self._call(lambda: self.api.read_deployment(self.namespace, self.name))
        if live is None:
            return
        running = _live_config(live) or self._running()
        self._follow(self.name, self.render(running, "main"), running)

    @property
    def _service(self) -> str:
        return service_name(self.name)

    def _service_selector(self, pods: Literal["main", "canary", "both"]) -> dict[str, str]:
        """The Service's selector for `pods`: a role's Deployment selector, or what the two
        have in common (the Service's own)."""
        main = self._selector(self.render(self._running(), "main"))
        canary = self._selector(self.render(self._running(), "canary"))
        if pods == "main":
            return main
        if pods == "canary":
            return canary
        return {k: v for k, v in main.items() if canary.get(k) == v}

    def _route(self, pods: Literal["main", "canary", "both"]) -> None:
        selector = self._service_selector(pods)
        self._call(lambda: self.api.set_service_selector(self.namespace, self._service, selector))
        self._notify("TrafficRouted", f"{self._service}: new requests to {pods} pods")

    def _at_full_load(self, config: SpecConfig, canary: Mapping[str, Any]) -> CanaryResult:
        """A trial at all of the load (runtime/full_load_trial.py): the Service routed to the
        canary's pods, read every `PROBE_S` and stopped at the probes that find it congested,
        judged on its time in system against the main pods' last window. The Service stays
        on the canary: rejected, deleting it (`_delete_canary`) sends new requests back to
        the main pods first; promoted, it serves on while the main pod is replaced."""
        assert self.last_observation is not None  # `_try_canary` starts none without it
        targets = self._targets(self._selector(canary))
        trial = FullLoadTrial(self.last_observation)
        windows, why_not, elapsed = [], None, 0.0
        self._route("canary")
        while why_not is None and elapsed < self.full_load_window_s:
            span = min(PROBE_S, self.full_load_window_s - elapsed)
            stats = self.metrics.window(self.engine, targets, span)
            windows.append(stats)
            elapsed += span
            why_not = trial.overloaded(observe(self.engine, stats), elapsed)
        per_pod: dict[str, list[WindowStats]] = {}
        for stats in windows:
            for s in stats:
                per_pod.setdefault(s.pod, []).append(s)
        joined = [consecutive(w) for w in per_pod.values()]
        served = self.last_canary_observation = observe(self.engine, joined) if joined else None
        if why_not is None:
            why_not = trial.verdict(served) if served else "no window of the canary's"
        kept = time_in_system(served) if served else None
        stay = "" if kept is None else f" ({kept:.2f} s in system over its window)"
        reason = (
            f"canary {config.describe()} promoted at all of the load{stay}"
            if why_not is None
            else f"canary {config.describe()} rejected: {why_not}"
        )
        return CanaryResult(config, None, None, why_not is None, reason)

    def _drain(self, targets: list[PodTarget]) -> None:
        """Read the canary's pods until they hold no request, for at most the rollout
        timeout's worth of probes (the caller deletes them either way)."""
        for _ in range(max(1, int(self.rollout_timeout_s / PROBE_S))):
            stats = self.metrics.window(self.engine, targets, PROBE_S)
            if not in_flight(observe(self.engine, stats)):
                return

    def _compare(self, config: SpecConfig, canary: Mapping[str, Any]) -> CanaryResult:
        main_targets = self._targets(self._selector(self.render(self._running(), "main")))
        canary_targets = self._targets(self._selector(canary))
        stats = self.metrics.window(
            self.engine, [*main_targets, *canary_targets], self.canary_window_s
        )
        per_pod = observe_per_pod(self.engine, stats)
        canary_names = {t.name for t in canary_targets}
        canary_stats = [s for s in stats if s.pod in canary_names]
        self.last_canary_observation = observe(self.engine, canary_stats) if canary_stats else None
        canary_speed = _sequence_speed(per_pod, canary_names)
        main_speed = _sequence_speed(per_pod, set(per_pod) - canary_names)
        if canary_speed is None or main_speed is None:
            return CanaryResult(
                config, canary_speed, main_speed, False,
                f"canary {config.describe()}: no load to compare (canary {canary_speed}, "
                f"main {main_speed} tok/s per sequence); not promoted",
            )  # fmt: skip
        promoted = canary_speed >= main_speed * (1.0 - self.canary_tolerance)
        verdict = "promoted" if promoted else "rejected"
        reason = (
            f"canary {config.describe()} {verdict}: {canary_speed:.1f} tok/s per sequence vs "
            f"{main_speed:.1f} on the main pods ({canary_speed / main_speed - 1:+.1%}, "
            f"tolerance {self.canary_tolerance:.0%})"
        )
        return CanaryResult(config, canary_speed, main_speed, promoted, reason)

    def _targets(self, selector: Mapping[str, str]) -> list[PodTarget]:
        pods = self._call(lambda: self.api.list_pods(self.namespace, selector))
        return [t for t in map(pod_target, pods) if t is not None]

    def _call(self, call: Callable[[], T]) -> T:
        return with_retries(call, sleep=self.sleep)

    @staticmethod
    def _selector(deployment: Mapping[str, Any]) -> dict[str, str]:
        labels: dict[str, str] = deployment["spec"]["selector"]["matchLabels"]
        return labels

    def _notify(self, reason: str, message: str) -> None:
        if self.notify is not None:
            self.notify(reason, message)


def _template(deployment: Mapping[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = (deployment.get("spec") or {}).get("template") or {}
    return template


def _annotation(deployment: Mapping[str, Any]) -> str:
    annotations = _template(deployment).get("metadata", {}).get("annotations") or {}
    return str(annotations.get(CONFIG_ANNOTATION, "null"))


def _live_config(deployment: Mapping[str, Any]) -> SpecConfig | None:
    try:
        return SpecConfig.from_json(_annotation(deployment))
    except ValueError:  # no annotation ("null") or a broken one
        return None


def _replicas(deployment: Mapping[str, Any]) -> int:
    return int((deployment.get("spec") or {}).get("replicas", 1))


def _held(deployment: Mapping[str, Any]) -> int | None:
    """The replica count a canary's slot is held from (None: no canary holds one)."""
    held = ((deployment.get("metadata") or {}).get("annotations") or {}).get(CANARY_SLOT_ANNOTATION)
    try:
        return int(held) if held is not None else None
    except ValueError:  # not ours to read: leave the count alone
        return None


def _same_template(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the live template already runs what `desired` would: same config annotation and
    the same containers' images, commands and args (fields a server defaults are ignored)."""

    def essence(deployment: Mapping[str, Any]) -> tuple[Any, ...]:
        containers = _template(deployment).get("spec", {}).get("containers") or []
        return (
            json.loads(_annotation(deployment)),
            [(c.get("name"), c.get("image"), c.get("command"), c.get("args")) for c in containers],
        )

    return essence(live) == essence(desired)


def _sequence_speed(per_pod: Mapping[str, Observation], names: set[str]) -> float | None:
    """Tokens/s per running request over these pods (None without load)."""
    tokens = running = 0.0
    for pod, o in per_pod.items():
        if pod in names and o.generation_tokens_per_s and o.running_requests:
            tokens += o.generation_tokens_per_s
            running += o.running_requests
    return tokens / running if running > 0 else None


def for_spec(
    *,
    api: DeploymentApi,
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    metrics: PodWindowSource,
    owner: Mapping[str, Any] | None = None,
    **options: Any,
) -> KubeActuator:
    """The actuator for one SpecDeployment, rendering with children.py; `options` are
    KubeActuator's (clock, sleep, notify, poll_s, canary_window_s, ...); the rollout timeout
    and canary switch come from the spec unless given. With `owner` (the SpecDeployment), what
    the actuator creates (a canary, a sidecar ConfigMap, a missing Deployment) carries a
    controller ownerReference, so it goes with the object even if the operator dies mid-way."""

    def adopt(child: dict[str, Any]) -> dict[str, Any]:
        if owner is not None:
            meta = owner["metadata"]
            child["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": owner["apiVersion"], "kind": owner["kind"],
                    "name": meta["name"], "uid": meta["uid"],
                    "controller": True, "blockOwnerDeletion": True,
                }
            ]  # fmt: skip
        return child

    def render(config: SpecConfig, role: Role) -> dict[str, Any]:
        return adopt(
            desired_deployment(name=name, namespace=namespace, spec=spec, config=config, role=role)
        )

    def render_sidecar(config: SpecConfig, role: Role) -> dict[str, Any] | None:
        found = desired_config_map(
            name=name, namespace=namespace, spec=spec, config=config, role=role
        )
        return None if found is None else adopt(found)

    options.setdefault("rollout_timeout_s", float(spec.tuning.rollout_timeout_s))
    options.setdefault("canary", spec.tuning.canary)
    options.setdefault("canary_in_place", spec.replicas is not None)
    options.setdefault("spare_replica", spec.tuning.max_surge > 0)
    return KubeActuator(
        api=api,
        name=name,
        namespace=namespace,
        engine=spec.engine,
        render=render,
        render_sidecar=render_sidecar,
        metrics=metrics,
        **options,
    )
