"""Learn: fold one window's measurements into the tuner state.

Contract: `learn(observation, state, settings, cost, now)` returns a `Belief` (the next state
and the surrogate the rest of the tick predicts with) or, when the window lacks the load or the
throughput it needs, the reason to hold: the tuner never guesses. It folds the running method's
acceptance counters into the acceptance posterior (which also moves the task weights, and
through them the methods not running: `TunerState.learn_acceptance`), blends the traffic's
prompt/output ratio and context per request, raises a method's capacity ceiling to what it
serves (`TunerState.served`), and remembers the window's batch (the load's trend); it also
learns the residual of measured over prior throughput, once the running config has served more
than a window and a half since the tuner's last switch (a window that saw the switch also saw
the restart's downtime and refill) and one learned window before this one (a new engine's
first loaded window is a cold engine's: `TunerState.last_window_s`), or from the first window
wholly after a switch onto a warm engine (`TunerSettings.warm_switches`), or from the first
window when the tuner has not switched yet, and never from a window in which a speculative
config drafted nothing (its speed is then a plain server's). A method marked as having drafted
nothing (`TunerState.no_drafts`) is re-tested, its counts speaking for it again, once
`retest_after_s` has passed since, an interval set by how long the traffic stays in one regime
as the tuner saw it (`regime_dwell_s`); the belief names it (`Belief.retested`).
`learn_trial(observation, config, state, settings, cost, now)` folds a trial's canary window
the same way for the config it ran (acceptance and throughput residual; not the traffic,
which the main replicas' windows measure) and says what it learned. Pure: `now` is the only clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Surrogate
from specpilot.tuner.observation import Observation
from specpilot.tuner.policy.ablation import average_acceptance, average_curves, average_sd
from specpilot.tuner.policy.latency import offered_demand
from specpilot.tuner.policy.proposal import trial_span_s
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import TunerState

MIN_RETEST_GAIN = 0.05
"""A method predicted to gain less than this once matched is re-tested as if it gained this:
the wait would grow without bound, and a re-test then costs nothing (the tuner switches only
to a config predicted faster than the running one)."""
MIN_RETEST_LOSS = 0.05
"""A re-test is priced at least this share of its span: one window that read no loss (a noisy
read) would otherwise, with no restart lost, re-test at every window."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Belief:
    """What the tuner holds true after this window."""

    state: TunerState
    batch: float
    """The window's mean running requests."""
    throughput: float
    """The window's measured output tokens/s per engine (`Observation.tokens_per_engine_s`)."""
    context: float
    """Context per running request the predictions assume."""
    acceptance: dict[str, AcceptanceCurve]
    """Per-method acceptance: each posterior's fitted chain (p, r)."""
    surrogate: Surrogate
    """The physics prior corrected by the learned residuals, with the estimates' spread."""
    retested: tuple[tuple[str, float], ...] = ()
    """(method, when it drafted nothing) per method this window's belief re-tests."""
    retest_waits: dict[str, RetestWait] = field(default_factory=dict)
    """Per re-tested method, the wait it was due after and what set it."""
    load_rise: float | None = None
    """`Observation.load_rise` of the window: how far the load moved inside it."""


def learn(
    observation: Observation,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> Belief | str:
    current = state.current
    batch = observation.running_requests
    throughput = observation.tokens_per_engine_s
    if batch is None or throughput is None or batch <= 0 or throughput <= 0:
        return (
            "holding: "
            + ", ".join(
                name
                for name, value in (("batch", batch), ("throughput", throughput))
                if value is None or value <= 0
            )
            + " unknown or idle in this window"
        )

    was_silent = state.drafted_nothing_since(current.method) is not None
    # a config's first window after a switch may be a re-test that drafts nothing again: the
    # traffic did not change then, the tuner's bet on it did
    settled = state.last_window_s is not None and state.since_s < state.last_window_s
    state = (
        _with_acceptance(state, current, observation, settings, now)
        .learn_traffic(observation, settings.kv_capacity_tokens)
        .served(current, throughput)
    )
    went_silent = (
        current.speculative
        and settled
        and not was_silent
        and state.drafted_nothing_since(current.method) is not None
    )
    state = state.note_regime(batch, went_silent, now)
    context = state.context_tokens or settings.context_tokens
    measures_speed = _measures_speed(state, settings, observation.window_s, now)
    if _drafted_nothing(current, observation) and measures_speed:
        plain = _prior_rate(state, SpecConfig(), batch, settings, cost)
        state = state.learn_no_draft_speed(current.method, math.log(throughput / plain))
    elif measures_speed:
        # A window that saw a switch also saw the restart's downtime and refill, and the first
        # window a new engine serves is a cold one's (on the real vLLM CPU server, 326 tok/s
        # against 666 on the same load before the switch: bench/results/real_vllm.md at
        # 77ee002): neither says how fast the new config runs. The config a deployment
        # started with served the whole window (an engine still starting reports no
        # throughput).
        prior = _prior_rate(state, current, batch, settings, cost)
        state = state.learn_throughput(current, batch, throughput / prior)
    # after this window's speed is learned: a re-test's loss and gain are read against what
    # no speculation serves, which this window may be the first to measure at this load (the
    # running method is never due: its own window re-marks it or clears it)
    waits = {
        method: retest_wait(method, state, settings, cost, batch, context, now)
        for method, _ in state.no_drafts
    }
    due = tuple((m, t) for m, t in state.no_drafts if now - t >= waits[m].seconds)
    state = state.retest([m for m, _ in due])
    acceptance = _curves(state, settings)
    surrogate = _surrogate(state, settings, cost)
    demand = offered_demand(throughput, batch, observation.waiting_requests or 0.0)
    return Belief(
        state=replace(
            state.remember_batch(batch).remember_demand(
                demand, observation.window_s, settings.expected_dwell_s
            ),
            last_window_s=now,
        ),
        batch=batch,
        throughput=throughput,
        context=context,
        acceptance=acceptance,
        surrogate=surrogate,
        retested=due,
        retest_waits={m: waits[m] for m, _ in due},
        load_rise=observation.load_rise,
    )


@dataclass(frozen=True, slots=True)
class RetestWait:
    """How long after a method drafted nothing the tuner bets on its counts again, and why."""

    seconds: float
    loss: float
    """The share of the plain server's speed a re-test loses if the traffic is still unmatched."""
    gain: float
    """The share the method gains over no speculation once the traffic matches again."""

    def describe(self) -> str:
        return (
            f"due after {self.seconds:.0f}s: drafting nothing lost {self.loss:.0%}, "
            f"drafting is predicted to gain {self.gain:+.0%} here"
        )


def retest_after_s(
    settings: TunerSettings, state: TunerState, now: float, loss: float = 1.0, gain: float = 1.0
) -> float:
    """How long after a method drafted nothing the tuner bets on its counts again.

    Traffic changes regime every `regime_dwell_s` (D) on average. Re-testing every T costs,
    once per T, the restarts there and back (R each, all serving lost) and a trial's span (S)
    at `loss`, the share of the plain server's speed the method loses while it drafts nothing;
    a change back to traffic it can match is found T/2 late on average, at `gain`, the share
    it gains then. The sum of the two is least at T = sqrt(2 D (2R + S x loss) / gain). With
    loss and gain both 1 (the defaults here) and the settings' defaults (900 s dwell before
    any window, 300 s minimum dwell, 60 s restarts) 869 s. On vLLM's CPU build with shared
    switches (no restart lost) n-gram K=5 lost about a quarter drafting nothing at concurrency
    1 and gained about +79% matched (bench/results/real_vllm-shared-rounds6.md, 2938c8b):
    sqrt(0.25 / 0.79), 0.56 of the wait that counts them equal."""
    risked = 2.0 * settings.restart_downtime_s + trial_span_s(settings) * max(loss, MIN_RETEST_LOSS)
    dwell = regime_dwell_s(settings, state, now)
    return math.sqrt(2.0 * dwell * risked / max(gain, MIN_RETEST_GAIN))


def _surrogate(state: TunerState, settings: TunerSettings, cost: StepCost) -> Surrogate:
    """The physics prior corrected by the residuals `state` holds, at its acceptance."""
    posterior = settings.acceptance_model == "posterior"
    return Surrogate(
        cost,
        _curves(state, settings),
        residuals=state.residuals,
        prefill_ratio=state.prefill_ratio,
        prompt_tokens=state.prompt_tokens if settings.lumpy_prefill else 0.0,
        acceptance_sd=state.acceptance_sd() if posterior else average_sd(state),
        residual_gp=settings.residual_model == "gp",
    )


def retest_wait(
    method: str,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    batch: float,
    context: float,
    now: float,
) -> RetestWait:
    """`retest_after_s` for `method` at this window's load: the gain its best candidate makes
    over no speculation on what it accepted when it drafted, and the loss of its windows
    without a draft, both against what no speculation serves here; each config read as its own
    windows at this load measured it, else as predicted (`_as_measured`). The loss is the gain
    until such a window measured it: the two counted alike."""
    matched = _surrogate(state.retest([method]), settings, cost)
    configs = [
        SpecConfig(),
        *(c for c in settings.candidates if c.speculative and c.method == method),
    ]
    predictions = matched.predict_many(configs, batch, context)
    plain, *rates = [
        _as_measured(config, predicted.tokens_per_s, state, matched, batch, context)
        for config, predicted in zip(configs, predictions, strict=True)
    ]
    gain = max(rates, default=plain) / plain - 1.0
    speed = dict(state.no_draft_speed).get(method)
    if speed is None:
        loss = gain
    else:
        silent = matched.prior(SpecConfig(), batch, context).tokens_per_s * math.exp(speed)
        loss = min(1.0, max(0.0, 1.0 - silent / plain))
    return RetestWait(retest_after_s(settings, state, now, loss, gain), loss, gain)


def _as_measured(
    config: SpecConfig,
    predicted: float,
    state: TunerState,
    surrogate: Surrogate,
    batch: float,
    context: float,
) -> float:
    """`config`'s tokens/s at `batch` as its own windows in this load bucket measured it (its
    prior times their mean residual), or as `predicted` where it never served one there.

    A re-test weighs two configs that ran in different phases against each other, and the GP
    reads a lone summary far from a config's others as mostly noise: on the real vLLM CPU
    server no speculation was predicted 3353 tok/s at batch 17.9 in the window that measured
    it serving 5177, so n-gram K=5's gain read +74% where the statics measured +28-33% (the
    shared three-tick run of eed6b98)."""
    own = state.measured_residual(config, batch)
    if own is None:
        return predicted
    return surrogate.prior(config, batch, context).tokens_per_s * math.exp(own)


def regime_dwell_s(settings: TunerSettings, state: TunerState, now: float) -> float:
    """The traffic's mean time in one regime, learned: the rate of regime changes has a Gamma
    prior worth one change per `expected_dwell_s` (what the tuner is told), updated by the
    changes it counted (`TunerState.note_regime`) over the time it watched; this is the mean
    dwell at the posterior's mean rate. Traffic that keeps changing shortens it, steady traffic
    lengthens it."""
    watched = 0.0 if state.watched_since_s is None else max(0.0, now - state.watched_since_s)
    return (settings.expected_dwell_s + watched) / (1.0 + state.regime_changes)


def learn_trial(
    observation: Observation,
    config: SpecConfig,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> tuple[TunerState, str]:
    """Fold a trial's canary window (the canary alone ran `config`) into the state; returns
    it and a note of what the window taught (or why it taught nothing)."""
    batch = observation.running_requests
    throughput = observation.tokens_per_engine_s
    if batch is None or throughput is None or batch <= 0 or throughput <= 0:
        return state, f"the canary's window of {config.describe()} held no load to learn from"
    before = _length(state, config, batch, settings)
    learned = _with_acceptance(state, config, observation, settings, now)
    if _drafted_nothing(config, observation):
        after = _length(learned, config, batch, settings)
        return learned, (
            f"the canary ran {config.describe()} at batch {batch:.1f} and drafted nothing: "
            f"acceptance length {before or 1.0:.2f} -> {after or 1.0:.2f}, its speed unlearned"
        )
    ratio = throughput / _prior_rate(learned, config, batch, settings, cost)
    learned = learned.learn_throughput(config, batch, ratio)
    after = _length(learned, config, batch, settings)
    note = (
        f"the canary ran {config.describe()} at batch {batch:.1f}: {throughput:.0f} tok/s, "
        f"{ratio:.2f}x the prior"
    )
    if before is not None and after is not None:
        note += f"; acceptance length {before:.2f} -> {after:.2f}"
    return learned, note


def _drafted_nothing(config: SpecConfig, observation: Observation) -> bool:
    """Whether a speculative config ran the window without proposing a draft (n-gram on
    sampled text: vLLM's CPU build at temperature 0.7 in bench/results/real_vllm.md at
    8e4f5b7). Such a window ran plain decode steps plus the matcher, so its speed says nothing
    of what the config costs when it speculates: dividing it by the prior at the posterior's
    acceptance blamed the config's step cost, and the tuner then predicted n-gram slower than
    no speculation in the last greedy phase, where static K=5 served 1.43x its tokens/s
    (204.4 against 142.6). The acceptance side still
    learns the window (an effective length of 1: `TunerState.learn_acceptance`). A schedule
    whose K at this batch is 0 meant to draft nothing: its window is its speed."""
    batch = observation.running_requests or 0.0
    return (
        config.speculative
        and observation.drafts == 0.0
        and config.k_for_batch(max(1, round(batch))) > 0
    )


def _measures_speed(
    state: TunerState, settings: TunerSettings, window_s: float, now: float
) -> bool:
    """Whether the window ending `now` measures the running config's speed: the config the
    deployment started with, any window; after a switch onto a warm engine
    (`TunerSettings.warm_switches`), a window wholly after it; after a restart, a window more
    than a window and a half after it and after one learned window (the cold engine's)."""
    if not state.restarts:
        return True
    if settings.warm_switches:
        return now - window_s >= state.since_s
    return _served_a_window_since_switch(state) and now - state.since_s > 1.5 * window_s


def _served_a_window_since_switch(state: TunerState) -> bool:
    """Whether the running config served a window the tuner learned from before this one."""
    return state.last_window_s is not None and state.last_window_s > state.since_s


def _with_acceptance(
    state: TunerState,
    config: SpecConfig,
    observation: Observation,
    settings: TunerSettings,
    now: float,
) -> TunerState:
    """The window's acceptance counters for `config` folded in by the settings' model."""
    if settings.acceptance_model == "posterior":
        return state.learn_acceptance(config, observation, now)
    return average_acceptance(state, config, observation)


def _curves(state: TunerState, settings: TunerSettings) -> dict[str, AcceptanceCurve]:
    if settings.acceptance_model == "posterior":
        return state.acceptance_curves()
    return average_curves(state)


def _prior_rate(
    state: TunerState, config: SpecConfig, batch: float, settings: TunerSettings, cost: StepCost
) -> float:
    """The physics prior's output tokens/s for `config` at `batch` under what `state` holds
    (what a measured rate is divided by to give its residual)."""
    context = state.context_tokens or settings.context_tokens
    prompt = state.prompt_tokens if settings.lumpy_prefill else 0.0
    surrogate = Surrogate(
        cost, _curves(state, settings), prefill_ratio=state.prefill_ratio, prompt_tokens=prompt
    )
    return surrogate.prior(config, batch, context).tokens_per_s


def _length(
    state: TunerState, config: SpecConfig, batch: float, settings: TunerSettings
) -> float | None:
    """The expected acceptance length the state holds for `config` at `batch`."""
    if not config.speculative:
        return None
    curve = _curves(state, settings).get(config.method)
    k = config.k_for_batch(max(1, round(batch)))
    return None if curve is None or k <= 0 else curve.expected_length(k)
