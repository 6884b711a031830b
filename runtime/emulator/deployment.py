"""An emulated Deployment in simulated time: N engine replicas behind a balancer, rolled out
the way Kubernetes rolls a Deployment, driven by the same control loop as the operator.

Contract: `EmulatedDeployment` is an `Actuator` for `specpilot.operator.loop.ControlLoop`
(`apply(config)`, `observe(window_s)`) whose clock is simulated: `observe` serves the arrivals
of the next `window_s` seconds and returns the Observation a scrape of every ready replica
would give (load per engine: the mean over replicas; tokens/s: their sum), and `apply` rolls
the new config out, serving traffic while it does, and returns when the rollout is done, as
`KubeActuator.apply` returns when `kubectl rollout status` would. Nothing here sleeps; `now`
is the simulated time.

- Replicas: `replicas` independent `EngineCore`s; each arrival goes to the ready replica with
  the fewest outstanding requests (running + waiting; ties to the lowest index), the way a
  least-outstanding-requests balancer (Envoy's least_request, the Gateway API inference
  extension) routes. While no replica is ready, arrivals wait at the client and are sent as
  soon as one is.
- Rollouts (`rollout`), each replica taking the world's engine start time to become ready:
  `surge` (maxSurge 1, maxUnavailable 0: a spare GPU): a new replica starts beside the old
  ones, and only when it is ready is one old replica stopped, N times; `one-at-a-time`
  (maxSurge 0, maxUnavailable 1): one replica is stopped, then replaced, N times, so N-1 serve
  meanwhile; `restart`: every replica stops and restarts at once (one replica: today's model).
- A stopped replica terminates as the operator's pod does (`pre_stop_s`, `drain_s`: the
  bench passes operator/kube/children's): it leaves the balancer and the scrapes at once,
  serves what it holds through the pre-stop sleep and the drain, and exits (freeing its GPU)
  once it is empty after the sleep. What it still holds at the drain's end (everything, with
  no drain: vLLM's own default) is retried by the client from the start on another replica,
  keeping its arrival time, so its wait counts in its latency; tokens streamed before the stop
  are lost to the user. A replica's pod waits for a free GPU (`replicas`, one more with
  surge), so a rollout waits for each stopped replica's exit before the next one starts
  where no GPU is spare. A surge's stopped replica finishes its queue on the spare GPU while
  its replacement serves new arrivals: under a queue, two GPUs serve for up to the drain, a
  capacity no replica count without rollouts has. `surge_handover` counts the rollout without
  it: the stopped replica's requests move to the balancer with their progress (as if the new
  config took them over in place) and its GPU is free at once; the spare GPU only loads the
  model.
- Trials (`TrialActuator`: `apply_trial`, `canary_share`, `trial_observation`), as
  `KubeActuator` runs them: with two or more replicas a trial's config first runs on a canary
  that takes one replica's place, so a trial never serves on more replicas than the static
  configs it is compared with (surge: the canary starts on the spare GPU and the replica
  retires once it is ready; otherwise the replica retires first and N-1 serve meanwhile).
  The canary takes its share of the traffic through the same balancer and, once it has
  served `canary_warmup_s` (it fills from empty, all its first requests' prefill at once, at
  a batch below the main replicas'), is compared with the main replicas over
  `canary_window_s` by per-sequence speed (tokens over the integral of the decode batch). It
  is then rolled out over every replica, the canary's slot last, unless it was slower than
  the main replicas by more than `canary_tolerance` or the trial's `judge` says why not: then
  the canary is replaced by a replica of the running config (its requests retried elsewhere)
  and `CanaryRejected` is raised. With one replica and a spare GPU (surge) the trial is one
  at all of the load (`runtime/full_load_trial.py`): the canary starts beside the replica,
  warms up at the balancer's share, then takes every new request for `full_load_window_s`
  while the replica finishes its own and idles, warm; it is stopped at the first probe
  (every `PROBE_S`) that finds it congested and judged on its time in system against the
  replica's last window (`observe`'s). Rejected, new requests go back to the replica;
  promoted, the idle replica stops and its successor, running the config, starts on its GPU
  while the canary serves on, and takes new requests once ready. Either way the canary then
  finishes what it holds and stops. With one replica and no spare GPU a trial is an `apply`.
- Every request is kept: `records(end_s)` returns them all for the serving metrics, those not
  finished by `end_s` as failed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, get_args

from specpilot.runtime.emulator.core import EngineCore, Progress, Request
from specpilot.runtime.full_load_trial import PROBE_S, WINDOW_S, FullLoadTrial
from specpilot.runtime.serving_metrics import ItlHistogram
from specpilot.tuner import AcceptanceCurve, Observation, SpecConfig, StepCost

Rollout = Literal["surge", "one-at-a-time", "restart"]
ROLLOUTS: tuple[str, ...] = get_args(Rollout)
AcceptanceSource = Callable[[str, str], AcceptanceCurve]


@dataclass(slots=True)
class _Replica:
    core: EngineCore
    ready_at: float
    clock: float
    """The end of the replica's last step (steps are atomic, so it can pass an event)."""
    leaving: _Leaving | None = None
    """Set once the replica is stopped: out of the balancer, finishing what it holds."""

    def outstanding(self) -> int:
        return len(self.core.running) + len(self.core.waiting)


@dataclass(frozen=True, slots=True)
class _Leaving:
    """A stopped replica's exit: not before its pre-stop sleep has run, and by the end of its
    drain at the latest, when what it still holds is aborted."""

    not_before: float
    by: float


@dataclass(slots=True)
class _WindowTotals:
    tokens: int = 0
    prefill_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """Drafts whose position i (0-based) was accepted, summed over replicas (vLLM's counter)."""
    finished: int = 0
    batch_time: dict[int, float] = field(default_factory=dict)
    """Per replica id: the integral of its decode batch over the window."""

    def add(self, replica_id: int, progress: Progress) -> None:
        self.tokens += progress.tokens
        self.prefill_tokens += progress.prefill_tokens
        self.drafts += progress.drafts
        self.draft_tokens += progress.draft_tokens
        self.accepted += progress.accepted
        self.finished += len(progress.finished)
        counts = progress.accepted_per_position
        self.accepted_per_position.extend([0] * (len(counts) - len(self.accepted_per_position)))
        for position, count in enumerate(counts):
            self.accepted_per_position[position] += count
        self.batch_time[replica_id] = self.batch_time.get(replica_id, 0.0) + progress.batch_time


_EXIT_POLL_S = 1.0
"""How often a rollout waiting for a GPU looks whether a stopped replica has emptied."""


class CanaryRejected(RuntimeError):
    """The canary was not promoted: slower per sequence than the main replicas beyond the
    tolerance, no load to compare, or the trial's judge said why not."""


class EmulatedDeployment:
    def __init__(
        self,
        *,
        config: SpecConfig,
        cost: StepCost,
        acceptance: AcceptanceSource,
        arrivals: Iterator[Request],
        engine: str = "vllm",
        replicas: int = 1,
        rollout: Rollout = "restart",
        start_time_s: float = 60.0,
        seed: int = 0,
        max_num_seqs: int | None = None,
        canary_window_s: float = 60.0,
        canary_warmup_s: float = 20.0,
        canary_tolerance: float = 0.05,
        full_load_window_s: float = WINDOW_S,
        pre_stop_s: float = 0.0,
        drain_s: float = 0.0,
        surge_handover: bool = False,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas={replicas}: allowed 1 or more")
        if rollout not in ROLLOUTS:
            raise ValueError(f"rollout={rollout!r}: allowed {' | '.join(ROLLOUTS)}")
        self.engine = engine
        self.config = config
        self.rollout: Rollout = rollout
        self.start_time_s = start_time_s
        self.pre_stop_s = pre_stop_s
        self.drain_s = drain_s
        self.surge_handover = surge_handover
        self._gpus = replicas + (1 if rollout == "surge" else 0)
        self.now = 0.0
        self.restarts = 0
        """Config changes applied (a rollback counts as one)."""
        self.rollout_s = 0.0
        """Simulated seconds spent inside `apply` (rollouts)."""
        self.itl = ItlHistogram()
        """Every inter-token gap served (one per decoding request per step)."""
        self._cost = cost
        self._acceptance = acceptance
        self._arrivals = arrivals
        self._next: Request | None = next(arrivals, None)
        self._seed = seed
        self._engines_started = 0
        self._max_num_seqs = max_num_seqs
        self._client: deque[Request] = deque()
        self._requests: list[Request] = []
        self._failed_retries = 0
        self._replicas: dict[int, _Replica] = {}
        self._next_id = 0
        for _ in range(replicas):
            self._start_replica(config, ready_at=0.0)
        self._window = _WindowTotals()
        self._window_start = 0.0
        self.canary_window_s = canary_window_s
        self.canary_warmup_s = canary_warmup_s
        self.canary_tolerance = canary_tolerance
        self.full_load_window_s = full_load_window_s
        self.canaries = 0
        """Trials run on a canary (promoted or not)."""
        self._canary: int | None = None
        self._canary_window: _WindowTotals | None = None
        self._trial: Observation | None = None
        self._last: Observation | None = None
        """The last window `observe` reported: a trial at all of the load compares with it."""
        self._route_only: int | None = None
        """The replica every new request goes to, bypassing the balancer (a trial at all of
        the load, and the drain after it)."""

    # -- the Actuator protocol ------------------------------------------------------------

    def apply(self, config: SpecConfig) -> None:
        """Roll `config` out (serving meanwhile); returns when every replica runs it."""
        if config == self.config:
            return
        started = self.now
        self.config = config
        self.restarts += 1
        self._roll(config, self._staying())
        self.rollout_s += self.now - started

    def observe(self, window_s: float) -> Observation:
        """Serve the next `window_s` seconds and report them as a scrape would."""
        self._window, self._window_start = _WindowTotals(), self.now
        self.run_until(self.now + window_s)
        self._last = self._observation(self._window, self.now - self._window_start, self._ready())
        return self._last

    # -- the TrialActuator protocol -------------------------------------------------------

    def canary_share(self) -> float | None:
        """1/N with N >= 2 replicas: the canary takes one replica's place behind the balancer;
        1/2 beside a single replica with a spare GPU (surge), where the canary takes all of the
        load but a warm replica takes it back at the first probe that finds it congested;
        None otherwise."""
        replicas = len(self._staying())
        if replicas >= 2:
            return 1.0 / replicas
        return 0.5 if self.rollout == "surge" else None

    def trial_observation(self) -> Observation | None:
        return self._trial

    def apply_trial(
        self, config: SpecConfig, judge: Callable[[Observation], str | None] | None = None
    ) -> None:
        """Run `config` on a canary in one replica's place, then roll it out or raise."""
        self._trial = None  # a window is only ever this trial's
        if config == self.config:
            return
        if self.canary_share() is None:
            self.apply(config)
            return
        if len(self._staying()) == 1:
            self._full_load_trial(config)
            return
        started = self.now
        canary = self._start_canary(config)
        self._window, self._canary, self._canary_window = _WindowTotals(), canary, _WindowTotals()
        self.run_until(self.now + self.canary_warmup_s)  # the fill-up is not the config's speed
        main, measured = _WindowTotals(), _WindowTotals()
        self._window, self._canary, self._canary_window = main, canary, measured
        window_start = self.now
        self.run_until(self.now + self.canary_window_s)
        span = self.now - window_start
        self._canary, self._canary_window = None, None
        self._trial = self._observation(measured, span, [(canary, self._replicas[canary])])
        self.canaries += 1
        why_not = self._canary_verdict(config, measured, main, judge)
        if why_not is None:
            self.rollout_s += self.now - started
            self.apply(config)  # the canary's id is the highest: it holds its slot till last
            return
        self._replace(canary, self.config)
        self.rollout_s += self.now - started
        raise CanaryRejected(why_not)

    def _full_load_trial(self, config: SpecConfig) -> None:
        """Beside the only replica (`runtime/full_load_trial.py`): the canary warms up at the
        balancer's share, then takes every new request for `full_load_window_s`, read every
        `PROBE_S` and stopped once a request stays longer on it than on the replica. Rejected,
        new requests go back to the replica; promoted, the idle replica is replaced on its
        own GPU by one running `config` while the canary serves on, and new requests go to
        that one once it is ready. Either way the canary then finishes what it holds and
        stops."""
        if self._last is None:
            raise CanaryRejected(
                f"canary {config.describe()} rejected: no window of the replica's to compare with"
            )
        started, (replica,) = self.now, self._staying()
        trial = FullLoadTrial(self._last)
        canary = self._start_beside(config)
        self._window, self._canary, self._canary_window = _WindowTotals(), canary, _WindowTotals()
        self.run_until(self.now + self.canary_warmup_s)
        measured = _WindowTotals()
        self._window, self._canary_window, self._route_only = _WindowTotals(), measured, canary
        why_not, window_start = None, self.now
        while why_not is None and self.now < window_start + self.full_load_window_s:
            before, probe_start = _probe_totals(measured, canary), self.now
            self.run_until(min(window_start + self.full_load_window_s, self.now + PROBE_S))
            probe = self._observation(
                _probe_totals(measured, canary, since=before),
                self.now - probe_start,
                [(canary, self._replicas[canary])],
            )
            why_not = trial.overloaded(probe, self.now - window_start)
        self._trial = self._observation(
            measured, self.now - window_start, [(canary, self._replicas[canary])]
        )
        self._canary, self._canary_window = None, None
        self.canaries += 1
        if why_not is None:
            why_not = trial.verdict(self._trial)
        if why_not is None:
            # promoted: the idle replica stops and its successor starts on that GPU while
            # the canary goes on serving all of the load
            self._stop_replica(replica)
            self.config, self.restarts = config, self.restarts + 1
            self._await_gpu()
            replica = self._start_replica(config, ready_at=self.now + self.start_time_s)
            self.run_until(self._replicas[replica].ready_at)
        self._route_only = replica
        while self._replicas[canary].outstanding():  # it finishes what it holds
            self.run_until(self.now + PROBE_S)
        self._route_only = None
        self._stop_replica(canary)
        self.rollout_s += self.now - started
        if why_not is not None:
            raise CanaryRejected(f"canary {config.describe()} rejected: {why_not}")

    def _canary_verdict(
        self,
        config: SpecConfig,
        measured: _WindowTotals,
        main: _WindowTotals,
        judge: Callable[[Observation], str | None] | None,
    ) -> str | None:
        """Why the canary is not promoted, or None when it is."""
        canary_speed, main_speed = _sequence_speed(measured), _sequence_speed(main)
        if canary_speed is None or main_speed is None:
            return (
                f"canary {config.describe()}: no load to compare (canary {canary_speed}, "
                f"main {main_speed} tok/s per sequence); not promoted"
            )
        if canary_speed < main_speed * (1.0 - self.canary_tolerance):
            return (
                f"canary {config.describe()} rejected: {canary_speed:.1f} tok/s per sequence "
                f"vs {main_speed:.1f} on the main replicas "
                f"({canary_speed / main_speed - 1:+.1%}, tolerance {self.canary_tolerance:.0%})"
            )
        why_not = judge(self._trial) if judge is not None and self._trial is not None else None
        return f"canary {config.describe()} rejected: {why_not}" if why_not else None

    # -- simulation -----------------------------------------------------------------------

    def run_until(self, until: float) -> None:
        """Serve every arrival and step every ready replica up to `until`."""
        while True:
            event = until
            if self._next is not None:
                event = min(event, self._next.arrival_s)
            pending = [r.ready_at for r in self._replicas.values() if r.ready_at > self.now]
            for replica in self._replicas.values():
                if replica.leaving is not None:
                    pending += [
                        t for t in (replica.leaving.not_before, replica.leaving.by) if t > self.now
                    ]
            if pending:
                event = min(event, *pending)
            self._advance_replicas(event)
            self.now = max(self.now, event)
            self._let_the_drained_exit()
            self._dispatch_client_queue()
            while self._next is not None and self._next.arrival_s <= self.now:
                request, self._next = self._next, next(self._arrivals, None)
                self._requests.append(request)
                self._dispatch(request)
            if self.now >= until:
                return

    def records(self) -> list[Request]:
        """Every request that arrived so far (finished or not), in arrival order."""
        return list(self._requests)

    def drain_arrivals(self) -> None:
        """Count the arrivals left before the end as requests (they are misses: never served)."""
        while self._next is not None:
            self._requests.append(self._next)
            self._next = next(self._arrivals, None)

    # -- internals ------------------------------------------------------------------------

    def _advance_replicas(self, until: float) -> None:
        for rid, replica in self._replicas.items():
            if replica.ready_at > until:
                continue
            start = max(replica.clock, replica.ready_at)
            if start >= until:
                continue
            end, progress = replica.core.advance(start, until)
            replica.clock = end
            if replica.leaving is not None:
                pass  # a terminating pod is not scraped (operator/kube/pod_metrics.py)
            elif rid == self._canary and self._canary_window is not None:
                self._canary_window.add(rid, progress)
            else:
                self._window.add(rid, progress)
            if len(progress.itl_gaps):
                self.itl.add_many(progress.itl_gaps, progress.itl_weights)

    def _staying(self) -> list[int]:
        """The replicas not stopped (ready or starting), in id order."""
        return sorted(rid for rid, r in self._replicas.items() if r.leaving is None)

    def _ready(self) -> list[tuple[int, _Replica]]:
        return [
            (rid, r)
            for rid, r in sorted(self._replicas.items())
            if r.ready_at <= self.now and r.leaving is None
        ]

    def _dispatch(self, request: Request) -> None:
        if self._route_only is not None:
            self._replicas[self._route_only].core.add_request(request)
            return
        ready = self._ready()
        if not ready:
            self._client.append(request)
            return
        _, replica = min(ready, key=lambda item: (item[1].outstanding(), item[0]))
        replica.core.add_request(request)

    def _dispatch_client_queue(self) -> None:
        if not self._client or not self._ready():
            return
        waiting, self._client = self._client, deque()
        for request in waiting:
            self._dispatch(request)

    def _start_replica(self, config: SpecConfig, *, ready_at: float) -> int:
        self._engines_started += 1
        extra = {} if self._max_num_seqs is None else {"max_num_seqs": self._max_num_seqs}
        core = EngineCore(
            config=config,
            performance=self._cost,
            acceptance=self._acceptance,
            seed=self._seed * 1_000_003 + self._engines_started,
            **extra,
        )
        rid, self._next_id = self._next_id, self._next_id + 1
        self._replicas[rid] = _Replica(core=core, ready_at=ready_at, clock=ready_at)
        return rid

    def _stop_replica(self, rid: int) -> None:
        """Stop one replica the way its pod terminates: out of the balancer at once, serving
        what it holds through the pre-stop sleep and the drain, and gone (its GPU free) once
        it is empty after the sleep, or at the drain's end with what it still holds retried."""
        replica = self._replicas[rid]
        if replica.leaving is None:
            not_before = self.now + self.pre_stop_s
            replica.leaving = _Leaving(not_before, not_before + self.drain_s)
        self._let_the_drained_exit()

    def _let_the_drained_exit(self) -> None:
        for rid, replica in list(self._replicas.items()):
            leaving = replica.leaving
            if leaving is None:
                continue
            empty = not replica.outstanding() and self.now >= leaving.not_before
            if empty or self.now >= leaving.by:
                self._remove_replica(rid)

    def _await_gpu(self) -> None:
        """Wait until a GPU is free for one more replica: a stopped one holds its GPU until it
        exits, so the next one's pod waits for it (Pending) as a pod on a full node does."""
        while len(self._replicas) >= self._gpus:
            exits = [r.leaving.by for r in self._replicas.values() if r.leaving is not None]
            if not exits:
                raise RuntimeError("no GPU free and none being freed")
            self.run_until(min(min(exits), self.now + _EXIT_POLL_S))

    def _remove_replica(self, rid: int) -> None:
        replica = self._replicas.pop(rid)
        orphans = [*replica.core.running, *replica.core.waiting]
        for request in orphans:  # the client retries from the start, same arrival time
            request.prefilled = 0
            request.generated = 0
            request.first_token_s = None
        for request in orphans:
            self._dispatch(request)

    def _roll(self, config: SpecConfig, replicas: list[int]) -> None:
        """Replace `replicas` by ones running `config`, the way the rollout strategy does."""
        if self.rollout == "restart":
            for rid in replicas:
                self._stop_replica(rid)
            started = []
            for _ in replicas:
                self._await_gpu()
                started.append(self._start_replica(config, ready_at=self.now + self.start_time_s))
            self.run_until(max(self._replicas[rid].ready_at for rid in started))
            return
        for rid in replicas:
            self._replace(rid, config)

    def _replace(self, rid: int, config: SpecConfig) -> int:
        """Replace one replica, returning the new one's id: with a spare GPU (surge) the new
        one starts first and the old one stops once it is ready; without one the old one
        stops first."""
        if self.rollout != "surge":
            self._stop_replica(rid)
        self._await_gpu()
        new = self._start_replica(config, ready_at=self.now + self.start_time_s)
        self.run_until(self._replicas[new].ready_at)
        if self.rollout == "surge" and self.surge_handover:
            self._hand_over(rid)
        elif self.rollout == "surge":
            self._stop_replica(rid)
        return new

    def _hand_over(self, rid: int) -> None:
        """The capacity-neutral count of a surge (`surge_handover`): the stopped replica's
        requests go back through the balancer with their progress, as if the replacement took
        them over in place, and its GPU is free at once."""
        replica = self._replicas.pop(rid)
        for request in [*replica.core.running, *replica.core.waiting]:
            self._dispatch(request)

    def _start_canary(self, config: SpecConfig) -> int:
        """Start the canary in the last replica's place (`_replace`'s order), so that a trial
        never serves on more replicas than the static configs it is compared with."""
        return self._replace(max(self._staying()), config)

    def _start_beside(self, config: SpecConfig) -> int:
        """Start the canary on the spare GPU beside the only replica, which serves meanwhile."""
        self._await_gpu()
        canary = self._start_replica(config, ready_at=self.now + self.start_time_s)
        self.run_until(self._replicas[canary].ready_at)
        return canary

    def _observation(
        self, w: _WindowTotals, window_s: float, ready: list[tuple[int, _Replica]]
    ) -> Observation:
        """What a scrape of the `ready` replicas over `w` would report."""
        served = [t / window_s for t in w.batch_time.values()] if window_s > 0 else []
        kv = [r.core.kv_usage for _, r in ready]
        running_now = [len(r.core.running) for _, r in ready]
        return Observation(
            engine=self.engine,
            window_s=window_s,
            # the replicas whose steps the window's tokens and batch come from (a rollout can
            # stop one mid-window), so tokens per engine and the mean batch count the same ones
            pods=tuple(f"replica-{rid}" for rid in sorted(w.batch_time))
            or tuple(f"replica-{rid}" for rid, _ in ready),
            acceptance_length=1 + w.accepted / w.drafts if w.drafts else None,
            acceptance_rate=w.accepted / w.draft_tokens if w.draft_tokens else None,
            # vLLM counts accepted tokens per draft position; SGLang does not
            acceptance_per_position=(
                tuple(a / w.drafts for a in w.accepted_per_position)
                if self.engine == "vllm" and w.drafts and w.accepted_per_position
                else None
            ),
            drafts=float(w.drafts) if w.drafts else None,
            # per engine, the mean over replicas of each one's time-averaged gauge, idle time
            # included, as engine_metrics reads scraped pods
            running_requests=sum(served) / len(served) if served and w.tokens else None,
            waiting_requests=(sum(len(r.core.waiting) for _, r in ready) + len(self._client))
            / max(1, len(ready)),
            kv_cache_usage=sum(kv) / len(kv) if kv else None,
            # a scrape reads both gauges at the same instant (the window's end, here)
            running_requests_gauge=sum(running_now) / len(running_now) if running_now else None,
            generation_tokens_per_s=w.tokens / window_s if w.tokens and window_s > 0 else None,
            tpot_p50_s=None,
            tpot_p95_s=None,
            ttft_p95_s=None,
            prompt_tokens_per_s=(
                w.prefill_tokens / window_s if w.prefill_tokens and window_s > 0 else None
            ),
            requests_per_s=w.finished / window_s if w.finished and window_s > 0 else None,
        )


def _probe_totals(
    w: _WindowTotals, replica: int, since: _WindowTotals | None = None
) -> _WindowTotals:
    """What a probe reads of one replica: its tokens, finished requests and batch integral so
    far in `w`, less what they were `since` (an earlier reading of the same window)."""
    start = since or _WindowTotals()
    return _WindowTotals(
        tokens=w.tokens - start.tokens,
        finished=w.finished - start.finished,
        batch_time={replica: w.batch_time.get(replica, 0.0) - start.batch_time.get(replica, 0.0)},
    )


def _sequence_speed(w: _WindowTotals) -> float | None:
    """Tokens per second per running request: tokens over the integral of the decode batch."""
    held = sum(w.batch_time.values())
    return w.tokens / held if w.tokens and held > 0 else None
