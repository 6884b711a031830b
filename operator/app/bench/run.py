"""One policy in one hidden world on one traffic: the fast-mode run behind `specpilot bench`.

Contract: `run_policy(setup, world_seed, policy)` builds the world's truth (acceptance and step
cost drawn by `runtime/emulator/world.py`, never shown to the tuner), an `EmulatedDeployment`
of `setup.replicas` replicas serving the setup's requests, and drives it for the traffic's
duration: a static policy just serves (one observed window after another); SpecPilot runs the
operator's own `ControlLoop` (goodput rollback, failed-config backoff) with the tuner knowing
only what a user's cluster would tell it: the published priors, the GPU catalog's nominal
roofline, the nominal restart time, and its measurements; it starts from `Tuning.initial`
(speculation off unless told). Returns a `PolicyRun`: every request
(for the serving metrics), the config and each window's requests, restarts and the tuner's
decisions. `run_schedule(setup, world_seed, name, schedule)` drives the same deployment through
a fixed list of switches instead of a policy. Pure of wall time: the same inputs give the same
run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from specpilot.operator.app.bench.policies import (
    HANDOVER,
    SPECPILOT,
    TUNED,
    StaticPolicy,
    space_for,
)
from specpilot.operator.app.bench.traffic import RequestTemplate
from specpilot.operator.kube.children import DRAIN_S, PRE_STOP_SLEEP_S
from specpilot.operator.loop import Actuator, ControlLoop
from specpilot.runtime.emulator.core import Request
from specpilot.runtime.emulator.deployment import EmulatedDeployment, Rollout
from specpilot.runtime.emulator.world import draw_world
from specpilot.runtime.serving_metrics import NO_GAPS, ItlCounts, RequestRecord
from specpilot.tuner import (
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    prior_curves,
)

NO_SPECULATION = SpecConfig()
NOMINAL_START_S = 60.0
"""The engine start (or restart) time the tuner assumes; each world draws its own truth."""
GOODPUT_TOLERANCE = 0.25
"""As the operator's tuning daemon (operator/kube/tuning_daemon.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """What a SpecDeployment's tuning section and the engine's start time would set. The
    defaults are the bench's (production-like); the demo compresses them (`specpilot demo`)."""

    start_s: float = NOMINAL_START_S
    """The nominal engine start (and restart) time: the tuner's restart cost, and the
    emulated engines' start time before the world's factor."""
    min_dwell_s: float = 120.0
    restart_budget_per_hour: int = 4
    expected_dwell_s: float = 600.0
    slo_tpot_p95_s: float | None = None
    initial: SpecConfig = NO_SPECULATION
    """The config SpecPilot's deployment starts with (speculation off where the engine cannot
    run it). Off by default, the safe start: started on EAGLE-3 K=3 (examples/vllm-eagle3.yaml's
    `speculative.initial`) under a Poisson load at 1.3x capacity, the tuner's prior cannot tell
    that EAGLE-3 holds less capacity than no speculation in a slow world and it stays there
    (world 1: mean E2E 220 s against 184 s, `specpilot bench --trace
    bench/traces/azure_conv_2023.csv --poisson 0.1:1.3:3 --worlds 3` with this set to EAGLE-3
    K=3); started off, at low load it pays one window and a rollout without speculation
instead (its first move may come before the dwell there: `policy.gate.early_first_move`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    gpu: str
    profile: str
    engine: str
    requests: tuple[RequestTemplate, ...]
    duration_s: float
    window_s: float = 60.0
    replicas: int = 1
    rollout: Rollout = "surge"
    seed: int = 0
    tuning: Tuning = Tuning()
    pre_stop_s: float = PRE_STOP_SLEEP_S
    """How long a stopped replica serves what it holds before it is told to stop: the
    operator's pod preStop sleep by default; a local engine process has none (`specpilot
    demo`)."""
    drain_s: float = DRAIN_S
    """How long a stopped replica may then finish what it holds before the client retries the
    rest elsewhere: the operator's drain by default; 0 for a local process restart, which drops
    its requests in flight."""


@dataclass(slots=True)
class PolicyRun:
    policy: str
    world_seed: int
    records: list[RequestRecord]
    restarts: int
    configs_by_window: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    observations: list[tuple[float, Observation]] = field(default_factory=list)
    """(tick time, what the tuner saw) per tick (SpecPilot only)."""
    itl: ItlCounts = NO_GAPS


def _deployment(
    setup: Setup, world_seed: int, initial: SpecConfig, *, surge_handover: bool = False
) -> EmulatedDeployment:
    world = draw_world(world_seed)
    return EmulatedDeployment(
        config=initial,
        cost=world.step_cost(setup.gpu, setup.profile),
        acceptance=world.acceptance_curve,
        arrivals=_arrivals(setup.requests),
        engine=setup.engine,
        replicas=setup.replicas,
        rollout=setup.rollout,
        start_time_s=world.start_time_s(setup.tuning.start_s),
        seed=setup.seed,
        pre_stop_s=setup.pre_stop_s,
        drain_s=setup.drain_s,
        surge_handover=surge_handover,
    )


def run_policy(setup: Setup, world_seed: int, policy: StaticPolicy | str) -> PolicyRun:
    initial = policy.config if isinstance(policy, StaticPolicy) else starting_config(setup)
    name = policy.name if isinstance(policy, StaticPolicy) else policy
    deployment = _deployment(setup, world_seed, initial, surge_handover=name == HANDOVER)
    configs: list[str] = []
    decisions: list[str] = []
    observations: list[tuple[float, Observation]] = []
    if name == SPECPILOT or name in TUNED:
        loop = control_loop(setup, deployment, TUNED.get(name, {}))
        while deployment.now < setup.duration_s:
            window_start = deployment.now
            record = loop.tick(deployment.now)
            observations.append((window_start, record.observation))
            configs.append(deployment.config.describe())
            if record.decision.action != "stay" or record.error:
                decisions.append(f"t={window_start:.0f}s {record.explanation}")
    else:
        while deployment.now < setup.duration_s:
            deployment.observe(min(setup.window_s, setup.duration_s - deployment.now))
            configs.append(deployment.config.describe())
    return _finished(setup, world_seed, name, deployment, configs, decisions, observations)


def run_schedule(
    setup: Setup,
    world_seed: int,
    name: str,
    schedule: Sequence[tuple[float, SpecConfig]],
    *,
    surge_handover: bool = False,
) -> PolicyRun:
    """A fixed sequence of switches, `(at_s, config)` in time order, the first at 0 (the start
    config): each applied at the first window boundary at or after its time, rolled out as
    `setup.rollout` rolls any switch (a surge counted without its drain with `surge_handover`,
    as `HANDOVER` counts it). What a decision's timing alone is worth, apart from the tuner
    that made it."""
    if not schedule or schedule[0][0] != 0.0:
        raise ValueError("a schedule starts with its config at 0 s")
    deployment = _deployment(setup, world_seed, schedule[0][1], surge_handover=surge_handover)
    pending = list(schedule[1:])
    configs: list[str] = []
    decisions: list[str] = []
    while deployment.now < setup.duration_s:
        if pending and deployment.now >= pending[0][0]:
            _, config = pending.pop(0)
            decisions.append(f"t={deployment.now:.0f}s -> {config.describe()}")
            deployment.apply(config)
        deployment.observe(min(setup.window_s, setup.duration_s - deployment.now))
        configs.append(deployment.config.describe())
    return _finished(setup, world_seed, name, deployment, configs, decisions, [])


def _finished(
    setup: Setup,
    world_seed: int,
    name: str,
    deployment: EmulatedDeployment,
    configs: list[str],
    decisions: list[str],
    observations: list[tuple[float, Observation]],
) -> PolicyRun:
    deployment.drain_arrivals()
    # Every policy is scored up to the trace's end: the loop's last window may run past it
    # (a rollout shifts its ticks), and what it finished there a static policy never could.
    end = setup.duration_s
    return PolicyRun(
        policy=name,
        world_seed=world_seed,
        records=[scored_at_end(r, end) for r in deployment.records()],
        restarts=deployment.restarts,
        configs_by_window=configs,
        decisions=decisions,
        observations=observations,
        itl=deployment.itl.compact(),
    )


def starting_config(setup: Setup) -> SpecConfig:
    """`setup.tuning.initial` where the engine's space holds it, else speculation off."""
    initial = setup.tuning.initial
    return initial if initial in space_for(setup.engine) else SpecConfig()


def tuner_settings(
    setup: Setup, nominal: StepCost, overrides: Mapping[str, object] | None = None
) -> TunerSettings:
    """What the operator would configure from a SpecDeployment with the bench's space and
    `setup.tuning`: the nominal restart time (not the world's), the catalog's KV capacity;
    `overrides` (an ablation's) replace settings by name."""
    tuning = setup.tuning
    settings = TunerSettings(
        candidates=space_for(setup.engine),
        min_dwell_s=tuning.min_dwell_s,
        restart_budget_per_hour=tuning.restart_budget_per_hour,
        # a surge rollout starts the new replica beside the old: no serving is lost but the
        # requests in flight on the replica it stops (switch_cost's recompute term)
        restart_downtime_s=0.0 if setup.rollout == "surge" else tuning.start_s,
        rollout_share=1.0 if setup.rollout == "surge" else (setup.replicas - 1) / setup.replicas,
        expected_dwell_s=tuning.expected_dwell_s,
        slo_tpot_p95_s=tuning.slo_tpot_p95_s,
        window_s=setup.window_s,
        kv_capacity_tokens=nominal.kv_capacity_tokens(),
        exploration=0.0,  # the operator's default: trials only with tuning.explore set
    )
    return replace(settings, **(overrides or {}))  # type: ignore[arg-type]


def control_loop(
    setup: Setup, actuator: Actuator, overrides: Mapping[str, object] | None = None
) -> ControlLoop:
    """The operator's ControlLoop as the bench runs it: nominal priors and roofline only."""
    nominal = StepCost.for_hardware(setup.gpu, setup.profile)
    settings = tuner_settings(setup, nominal, overrides)
    state = TunerState.initial(starting_config(setup), 0.0, prior_curves(settings.candidates))
    return ControlLoop(
        actuator=actuator,
        settings=settings,
        cost=nominal,
        state=state,
        window_s=setup.window_s,
        goodput_tolerance=GOODPUT_TOLERANCE,
        probe_first_window=True,
    )


def _arrivals(templates: tuple[RequestTemplate, ...]) -> Iterator[Request]:
    for number, t in enumerate(templates):
        yield Request(
            request_id=f"r{number}",
            task=t.task,
            prompt_tokens=t.prompt_tokens,
            max_tokens=t.output_tokens,
            arrival_s=t.arrival_s,
        )


def scored_at_end(request: Request, end_s: float) -> RequestRecord:
    """The request as the yardstick scores it at the trace's end: unfinished by then, it failed
    and waited until then, whenever it finished after."""
    done = request.finished_s is not None and request.finished_s <= end_s
    return RequestRecord(
        arrival_s=request.arrival_s,
        first_token_s=request.first_token_s if done else None,
        finished_s=request.finished_s if done else None,
        output_tokens=request.generated if done else 0,
        failed=not done,
        given_up_s=None if done else end_s,
    )
