"""The policy: each tick, stay or switch (method, K, schedule, or speculation off).

Contract: `decide(observation, state, settings, cost, now)` is pure: it returns a `Decision`
and the next `TunerState`, and reads no clock (time is `now`, seconds). It
- holds when the observation lacks the load or throughput it needs (never guesses);
- learns from the running config: its method's acceptance (blended into the estimate), the
  hardware step-time factor, and the residual of measured over prior throughput;
- scores every candidate at the current load with the surrogate, drops those predicted to
  break the SLO (per-token latency p95, via the predicted TPOT), and switches only when the
  predicted gain over the expected dwell beats the restart cost plus hysteresis, after the
  minimum dwell and within the restart budget; under an SLO the restart cost includes the
  backlog its downtime leaves, when draining it at max-num-seqs would break the SLO;
- explores, when nothing is predicted better on the mean, the candidate with the largest
  expected improvement (its predicted throughput taken as log-normal with the surrogate's
  uncertainty) whose pessimistic prediction is within `max_downside` of the current config,
  if that improvement over the dwell pays for the restart (and the one undoing a failed
  trial would cost).
Every decision carries a one-line reason, the predicted gain and the regime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.schedule import synthesize_schedule
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Prediction, Surrogate
from specpilot.tuner.observation import Observation
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import TunerState

Action = Literal["stay", "switch", "off"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerSettings:
    candidates: tuple[SpecConfig, ...]
    """The space: every allowed config (static K), already filtered by engine capability."""
    synthesize_schedules: bool = True
    """Also consider, per method, its largest K with a schedule synthesised from the model."""
    min_dwell_s: float = 300.0
    restart_budget_per_hour: int = 4
    restart_downtime_s: float = 60.0
    """Capacity lost per switch: a restart (or a rollout's surge) costs this much serving."""
    expected_dwell_s: float = 900.0
    """Horizon the gain of a switch is counted over."""
    hysteresis: float = 0.05
    """Minimum relative gain to act on, whatever the cost."""
    saturation_tolerance: float = 0.02
    """How far below the best a config may be at saturation (max-num-seqs reached): there a
    capacity shortfall is not a slowdown but a queue that grows for as long as it lasts."""
    slo_tpot_p95_s: float | None = None
    """Per-token latency target: configs predicted to break it are not chosen, and a restart
    pays for the backlog it would serve too slowly. None: throughput alone counts."""
    slo_ttft_p95_s: float | None = None
    """Time-to-first-token target: a restart whose downtime exceeds it pays for the requests
    that wait longer (the tuner does not predict TTFT per config)."""
    max_downside: float = 0.05
    window_s: float = 60.0
    """Seconds between decisions (the spacing of the batches the forecast extrapolates)."""
    exploration: float = 1.0
    """Weight on a trial's expected improvement (0 disables exploration)."""
    max_batch: int = 256
    """The engine's max-num-seqs: the most concurrent requests a forecast can reach."""
    context_tokens: float = 1024.0
    """Mean context per running request, unless the KV usage can tell (kv_capacity_tokens)."""
    kv_capacity_tokens: int | None = None
    """KV tokens the engine holds (e.g. `StepCost.kv_capacity_tokens()` for a catalog GPU);
    with it the context per request is read from the engine's KV usage. None where the
    capacity is not known (a CPU, a measured fit): context_tokens is used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    config: SpecConfig
    reason: str
    predicted_gain: float
    """Relative throughput gain predicted for `config` over the running one (0 when staying)."""
    regime: str
    predicted_tokens_per_s: float | None = None


def decide(
    observation: Observation,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> tuple[Decision, TunerState]:
    current = state.current
    batch = observation.running_requests
    throughput = observation.generation_tokens_per_s
    if batch is None or throughput is None or batch <= 0 or throughput <= 0:
        reason = (
            "holding: "
            + ", ".join(
                name
                for name, value in (("batch", batch), ("throughput", throughput))
                if value is None or value <= 0
            )
            + " unknown or idle in this window"
        )
        return Decision(
            action="stay", config=current, reason=reason, predicted_gain=0.0, regime="unknown"
        ), state

    state = state.learn_acceptance(current, observation, now).learn_traffic(
        observation, settings.kv_capacity_tokens
    )
    context = state.context_tokens or settings.context_tokens
    acceptance = state.acceptance_curves()
    prior = Surrogate(cost, acceptance, prefill_ratio=state.prefill_ratio).prior(
        current, batch, context
    )
    if now - state.since_s > 1.5 * observation.window_s:
        # A window that saw the switch also saw the restart's downtime and refill: it says
        # nothing about how fast the new config runs.
        state = state.learn_throughput(current, batch, throughput / prior.tokens_per_s)
    surrogate = Surrogate(
        cost,
        acceptance,
        residuals=state.residuals,
        prefill_ratio=state.prefill_ratio,
        acceptance_sd=state.acceptance_sd(),
    )

    space = _space(settings, acceptance, cost, state.prefill_ratio, context)
    scored = _score(surrogate, space, batch, context, settings)
    now_pred = surrogate.predict(current, batch, context)
    regime = now_pred.regime
    state = state.remember_batch(batch)
    forecast = _forecast_batch(state.recent_batches, settings)
    if forecast is not None:
        scored, current_merit = _plan_ahead(
            scored, surrogate, current, now_pred, forecast, context, cost, settings
        )
        # The running config is judged by the same plan: it too may face a restart ahead.
        now_pred = replace(now_pred, tokens_per_s=now_pred.tokens_per_s * current_merit)
    best_config, best = max(scored, key=lambda item: item[1].tokens_per_s)
    gain = best.tokens_per_s / now_pred.tokens_per_s - 1.0

    def stay(reason: str) -> tuple[Decision, TunerState]:
        return Decision(
            action="stay",
            config=current,
            reason=reason,
            predicted_gain=0.0,
            regime=regime,
            predicted_tokens_per_s=now_pred.tokens_per_s,
        ), state

    improvement = best.tokens_per_s - now_pred.tokens_per_s
    trial_failure = 0.0
    if best_config == current:
        explore = _explore(scored, current, now_pred, settings)
        if explore is None:
            return stay(f"{current.describe()} is predicted best at batch {batch:.1f} ({regime})")
        best_config, best, improvement, trial_failure = explore
        gain = improvement / now_pred.tokens_per_s
        why = (
            f"exploring (expected improvement, {trial_failure:.0%} chance it is slower, "
            f"downside within {settings.max_downside:.0%})"
        )
    else:
        why = "predicted faster"
        if forecast is not None:
            why += f" (load heading to batch {forecast:.0f})"
    dwell = now - state.since_s
    if dwell < settings.min_dwell_s:
        return stay(
            f"{best_config.describe()} predicted {gain:+.1%} but dwell {dwell:.0f}s < "
            f"minimum {settings.min_dwell_s:.0f}s"
        )
    recent = [t for t in state.restarts if now - t < 3600]
    if len(recent) >= settings.restart_budget_per_hour:
        return stay(
            f"{best_config.describe()} predicted {gain:+.1%} but the restart budget "
            f"({settings.restart_budget_per_hour}/h) is spent"
        )
    # A trial that disappoints is undone: it may cost a second restart.
    switch_cost = _switch_cost(now_pred.tokens_per_s, batch, context, cost, settings) * (
        1.0 + trial_failure
    )
    switch_cost += _backlog_cost(
        best_config, throughput, now_pred.tpot_s, surrogate, context, settings
    )
    payoff = improvement * settings.expected_dwell_s
    # At max-num-seqs a shortfall is a queue that grows for as long as it lasts, not a
    # slowdown: the smaller saturation tolerance applies there.
    hurdle = settings.saturation_tolerance if _saturating(batch, settings) else settings.hysteresis
    if gain < hurdle or payoff <= switch_cost:
        return stay(
            f"{best_config.describe()} predicted {gain:+.1%}: below hysteresis "
            f"{hurdle:.0%} or not worth a restart "
            f"({payoff:.0f} tokens gained vs {switch_cost:.0f} lost)"
        )
    action: Action = "off" if not best_config.speculative else "switch"
    reason = (
        f"{why}: {best_config.describe()} {gain:+.1%} over {current.describe()} at batch "
        f"{batch:.1f} ({regime}, {best.tokens_per_s:.0f} vs {now_pred.tokens_per_s:.0f} "
        f"tok/s predicted{_acceptance_note(best_config, best.k, state, acceptance)})"
    )
    state = replace(state, current=best_config, since_s=now, restarts=(*recent, now))
    return Decision(
        action=action,
        config=best_config,
        reason=reason,
        predicted_gain=gain,
        regime=regime,
        predicted_tokens_per_s=best.tokens_per_s,
    ), state


def _acceptance_note(
    config: SpecConfig, k: int, state: TunerState, acceptance: dict[str, AcceptanceCurve]
) -> str:
    """', acceptance 3.10+-0.42 (prior)': the length the prediction assumed at this K, its
    spread (p one sd either way) and whether it was measured."""
    curve = acceptance.get(config.method)
    if curve is None or k <= 0:
        return ""
    sd = state.acceptance_sd().get(config.method, 0.0)
    low, high = curve.length_range(k, sd)
    source = "measured" if config.method in dict(state.acceptance_support) else "prior"
    return f", acceptance {curve.expected_length(k):.2f}+-{(high - low) / 2:.2f} ({source})"


def _space(
    settings: TunerSettings,
    acceptance: dict[str, AcceptanceCurve],
    cost: StepCost,
    prefill_ratio: float,
    context: float,
) -> list[SpecConfig]:
    space = list(settings.candidates)
    if settings.synthesize_schedules:
        by_method: dict[str, SpecConfig] = {}
        for config in settings.candidates:
            if config.speculative and config.max_k > by_method.get(config.method, config).max_k:
                by_method[config.method] = config
            by_method.setdefault(config.method, config)
        for config in by_method.values():
            curve = acceptance.get(config.method)
            if not config.speculative or curve is None or config.schedule is not None:
                continue
            schedule = synthesize_schedule(config, curve, cost, context, prefill_ratio)
            if schedule is not None:
                top = max(k for _, _, k in schedule)
                space.append(replace(config, num_speculative_tokens=top, schedule=schedule))
    return space


def _score(
    surrogate: Surrogate,
    space: Sequence[SpecConfig],
    batch: float,
    context: float,
    settings: TunerSettings,
) -> list[tuple[SpecConfig, Prediction]]:
    scored = list(zip(space, surrogate.predict_many(space, batch, context), strict=True))
    if settings.slo_tpot_p95_s is not None:
        within = [(c, p) for c, p in scored if p.tpot_s <= settings.slo_tpot_p95_s]
        scored = within or scored  # nothing meets the SLO: keep the fastest, and say so later
    return scored


def _forecast_batch(recent: Sequence[float], settings: TunerSettings) -> float | None:
    """Where the load is heading over the next half dwell, if it is clearly moving.

    The geometric trend of the last windows' batch, extrapolated and bounded (at most 16x either
    way, at most max-num-seqs); None when the load is steady (under 25% change forecast).
    """
    if len(recent) < 3 or min(recent) <= 0:
        return None
    steps = len(recent) - 1
    growth = math.pow(recent[-1] / recent[0], 1 / steps)
    horizon_windows = max(1.0, settings.expected_dwell_s / 2 / settings.window_s)
    forecast = recent[-1] * min(max(math.pow(growth, horizon_windows), 1 / 16), 16.0)
    forecast = min(forecast, float(settings.max_batch))
    if abs(math.log(forecast / recent[-1])) < math.log(1.25):
        return None
    return forecast


def _saturating(batch: float, settings: TunerSettings) -> bool:
    """At (or within 10% of) max-num-seqs, where the saturation tolerance applies."""
    return batch >= 0.9 * settings.max_batch


def _switch_cost(
    tokens_per_s: float, batch: float, context: float, cost: StepCost, settings: TunerSettings
) -> float:
    """Tokens a restart loses: its downtime at the current rate, plus the time the new engine
    spends recomputing the running requests' context before it serves again."""
    recompute_s = batch * context * cost.step_model.per_token_s
    return (settings.restart_downtime_s + recompute_s) * tokens_per_s


def _backlog_cost(
    config: SpecConfig,
    tokens_per_s: float,
    now_tpot_s: float,
    surrogate: Surrogate,
    context: float,
    settings: TunerSettings,
) -> float:
    """Tokens a restart's backlog costs under the latency SLOs (goodput counts only the
    requests that meet them); zero without SLOs.

    Requests keep arriving while the engine is down. The first ones wait the whole downtime
    for their first token: with a TTFT target shorter than the downtime, the requests that
    arrive during (downtime - target) miss it. Afterwards the engine serves the backlog at
    once, up to max-num-seqs, and it drains over downtime x rate / (capacity - rate): with a
    per-token target the engine meets now but `config` breaks at that batch, nothing served
    while it drains counts (near capacity, far longer than the downtime). A request that misses
    both targets is lost once: the larger of the two spans counts.
    """
    lost_s = 0.0
    tpot = settings.slo_tpot_p95_s
    if tpot is not None and now_tpot_s <= tpot:
        full = surrogate.predict(config, float(settings.max_batch), context)
        if full.tpot_s > tpot:
            spare = full.tokens_per_s - tokens_per_s
            lost_s = (
                settings.expected_dwell_s
                if spare <= 0
                else settings.restart_downtime_s * tokens_per_s / spare
            )
    ttft = settings.slo_ttft_p95_s
    if ttft is not None:
        lost_s = max(lost_s, settings.restart_downtime_s - ttft)
    return min(lost_s, settings.expected_dwell_s) * tokens_per_s


def _plan_ahead(
    scored: Sequence[tuple[SpecConfig, Prediction]],
    surrogate: Surrogate,
    current: SpecConfig,
    now_pred: Prediction,
    forecast: float,
    context: float,
    cost: StepCost,
    settings: TunerSettings,
) -> tuple[list[tuple[SpecConfig, Prediction]], float]:
    """Each config's merit over the dwell ahead when the load is moving, relative to now.

    The merit weighs the forecast load twice as much as the present (most of the dwell is
    spent there), and a config that will not be near-best at the forecast pays, spread over
    the dwell, the restart it will need then: switching at a high load costs most, so it is
    better to arrive there already on the right config. Returns the planned predictions (rates
    scaled by merit) and the running config's own merit.
    """
    configs = [c for c, _ in scored]
    predictions = surrogate.predict_many([*configs, current], forecast, context)
    ahead = {c: p.tokens_per_s for c, p in zip(configs, predictions, strict=False)}
    ahead_current = predictions[-1].tokens_per_s
    best_ahead = max(ahead.values())
    later_switch = _switch_cost(best_ahead, forecast, context, cost, settings) / (
        now_pred.tokens_per_s * settings.expected_dwell_s
    )
    tolerance = (
        settings.saturation_tolerance if _saturating(forecast, settings) else settings.hysteresis
    )

    def merit(now_rate: float, ahead_rate: float) -> float:
        value = (now_rate / now_pred.tokens_per_s + 2 * ahead_rate / ahead_current) / 3
        return value - later_switch if best_ahead > ahead_rate * (1 + tolerance) else value

    planned = [
        (c, replace(p, tokens_per_s=now_pred.tokens_per_s * merit(p.tokens_per_s, ahead[c])))
        for c, p in scored
    ]
    return planned, merit(now_pred.tokens_per_s, ahead_current)


def _explore(
    scored: Sequence[tuple[SpecConfig, Prediction]],
    current: SpecConfig,
    now_pred: Prediction,
    settings: TunerSettings,
) -> tuple[SpecConfig, Prediction, float, float] | None:
    """The trial most worth making when no config is predicted better on the mean.

    A candidate's throughput is taken as log-normal around its prediction with the surrogate's
    uncertainty; its expected improvement over the running config (tokens/s, weighted by
    `exploration`) is what a trial buys. Only candidates whose pessimistic prediction (one sd
    down) is within `max_downside` of the running config are tried. Returns the config, its
    prediction, the weighted expected improvement and the chance it turns out slower.
    """
    if settings.exploration <= 0:
        return None
    floor = (1 - settings.max_downside) * now_pred.tokens_per_s
    best: tuple[SpecConfig, Prediction, float, float] | None = None
    for config, pred in scored:
        sigma = pred.uncertainty
        if config == current or sigma <= 0 or pred.tokens_per_s * math.exp(-sigma) < floor:
            continue
        z = math.log(pred.tokens_per_s / now_pred.tokens_per_s) / sigma
        improvement = settings.exploration * (
            pred.tokens_per_s * math.exp(sigma**2 / 2) * _normal_cdf(z + sigma)
            - now_pred.tokens_per_s * _normal_cdf(z)
        )
        if best is None or improvement > best[2]:
            best = (config, pred, improvement, _normal_cdf(-z))
    return best


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
