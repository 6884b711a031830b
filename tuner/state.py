"""Tuner state: what the tuner has learned, as bounded JSON an operator can persist and resume.

Contract: `TunerState` is frozen; learning returns a new state. It holds the running config and
since when, recent restart times (the last hour's), per method the published prior it started
from and the engine's discounted acceptance counts per draft position (with the task weights
they were measured under: `_model/acceptance_posterior.py`), the traffic's task weights as a
Dirichlet (`_model/task_mix.py`), the traffic's prompt/output token ratio and context per
request, the last few windows' batch (the load's trend), what each speculative method left
for capacity served then, and per-(config, batch bucket) residual summaries (log of measured
over prior throughput, recent windows weighted most), at most MAX_RESIDUALS of them (the
least-supported are dropped first), so its JSON stays small whatever the history length.

Acceptance is a posterior: `acceptance_curves()` and `acceptance_sd()` give each method's
fitted chain (p, r) and the standard deviation of p, for every method, running or not. The
running method's window moves the task weights first (by how far its length departs from its
own estimate), then adds its counts (per position where the engine gives them, from the mean
length otherwise); a method that is not running follows the task weights through its prior. A
window in which the running method proposed no draft is not counted: the method is marked
(`no_drafts`) and accepts none until it drafts again or the policy re-tests it. The state also
counts the traffic's regime changes it saw and since when it watched (`note_regime`): how long
traffic stays in one regime, which sets how soon a silent method is re-tested.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from specpilot.tuner._model import task_mix
from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.acceptance_posterior import (
    WINDOW_ESS,
    Counts,
    Estimate,
    MethodPrior,
    absorb,
    counts_from_length,
    counts_from_survival,
    estimate,
    idle,
)
from specpilot.tuner._model.surrogate import ResidualPoint
from specpilot.tuner.observation import Observation
from specpilot.tuner.priors import TASKS, method_prior, task_of
from specpilot.tuner.spec_config import ConfigError, SpecConfig

MAX_RESIDUALS = 128
LEARNING_RATE = 0.3
"""Weight of a new window in the moving traffic estimates (prompt ratio, context)."""
RECENT_WINDOWS = 4
MAX_RESIDUAL_WEIGHT = 8.0
"""A residual summary averages about this many recent windows, so it follows drift."""
MAX_ACCEPTANCE_SUPPORT = 100.0
"""Windows counted behind an estimate at most (the count only says measured or not; the
posterior's own effective sample size is capped in `_model/acceptance_posterior.py`)."""
NO_DRAFT_MIN_TOKENS = 256.0
"""Output tokens a speculative config must generate in a window without one draft for the
window to count as acceptance of none: fewer may be first tokens alone (prefill), which
no drafter ever proposes for."""
INITIAL_TASK_STRENGTH = 2.0
"""Pseudo-windows behind the initial task weights: the first clear move of the running
method's acceptance is enough to shift them."""
WINDOW_LENGTH_SD = 0.05
"""A window's mean length wobbles this much with the requests it happened to serve."""
REGIME_BATCH_STEP = 2.0
"""A load that moves this factor either way from where the last regime change left it has
changed regime (memory-bound to compute-bound spans more; a window's noise, much less)."""


def residual_bucket(batch: float) -> int:
    """The load bucket a window's residual is summarised in: its mean batch's nearest power of
    two (batches under 1 in the first)."""
    return round(math.log2(max(batch, 1.0)))


AcceptanceCounts = tuple[str, tuple[float, ...], tuple[float, ...], tuple[float, ...]]
"""(method, accepted per position, tried per position, task weights they were measured under)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerState:
    current: SpecConfig
    since_s: float
    restarts: tuple[float, ...] = ()
    acceptance: tuple[tuple[str, float, float], ...] = ()
    """(method, p, r) per method: the prior it started from, for traffic all of `prior_task`.
    What was learned is in `acceptance_counts`; `acceptance_curves()` is the estimate."""
    acceptance_support: tuple[tuple[str, float], ...] = ()
    """(method, windows) behind each estimate; a method absent here has not run."""
    acceptance_counts: tuple[AcceptanceCounts, ...] = ()
    """Per method that has run: the engine's discounted acceptance counts."""
    prior_task: str = "chat"
    """The task the priors were taken for: the task weights start mostly there."""
    task_mix: tuple[float, ...] = ()
    """The traffic's task weights (Dirichlet mean, in `TASKS` order); empty: the initial ones."""
    task_strength: float = INITIAL_TASK_STRENGTH
    """The Dirichlet's concentration: how sure the task weights are."""
    residuals: tuple[ResidualPoint, ...] = ()
    prefill_ratio: float = 0.0
    """Prompt tokens prefilled per output token, a moving estimate from the traffic."""
    prompt_tokens: float = 0.0
    """Mean prompt tokens per request, a moving estimate (0 until the engine reports its
    finished requests): how lumpy the prefill is (`StepCost.serving_step_time`)."""
    context_tokens: float = 0.0
    """Mean KV tokens per running request, a moving estimate (0 until the engine reports)."""
    recent_batches: tuple[float, ...] = ()
    """The last RECENT_WINDOWS windows' mean batch, oldest first: the load's trend."""
    demand_peak: float = 0.0
    """The most output tokens/s per engine the traffic asked for in a window, decaying by half
    every `TunerSettings.expected_dwell_s` of observed windows (`remember_demand`; the
    operator observes 0.8 of each interval, so there it halves every 1.25 dwells of wall
    time): bursty traffic comes back to its peaks, and a config entered for its dwell must
    hold them, not just the trend of the last few windows."""
    capacity_exits: tuple[tuple[str, float, float], ...] = ()
    """(method, output tokens/s, no speculation's capacity then) per speculative method the
    tuner left for capacity: the most it served in a window of the run it was left from (under
    a queue, its capacity), or, where it still kept up with the demand, the capacity the tuner
    read for it if that is more (`policy.decision.exit_ceiling`); raised to the most it has
    served since. The third figure is the capacity the tuner read for no speculation in the
    exit window (0: unknown, a state written before it was kept): the policy carries the held
    figure to today's batch and context by no speculation's capacity read now over that
    (`policy.latency_proposal.exit_ceilings`): a figure read at a light context overstates
    what the method serves under a heavier one, and its ratio to no speculation carries
    across batches and contexts where the figure does not. The physics
    prior's capacity at a batch the method never ran at is a guess, and the exit is what was
    seen."""
    served_peak: float = 0.0
    """The most output tokens/s the running config served in a window since it started: a
    method left for capacity has shown at least this (`policy.decision.exit_ceiling`)."""
    last_window_s: float | None = None
    """When the last window the tuner learned from ended (its `now`); None before the first.
    A window is the running config's first when this is not after `since_s`: a freshly
    started engine compiles, allocates and fills its caches on its first load, so that window
    shows a cold engine's speed, not the config's (`policy.learn`)."""
    forecast_shortfall: bool = False
    """Whether the last window the tuner decided on would have left the running config for a
    load only forecast (`Proposal.on_forecast`): such an exit is made on the second window in
    a row that sees it, since one window's trend is as often a phase change or a noisy read
    as a load on its way (`policy.decision`)."""
    canary_only: tuple[SpecConfig, ...] = ()
    """Configs a trial's canary measured that the main replicas have not run since: the tuner
    reads their capacity one sd down (`TunerSettings.unproven`). Kept here so that an operator
    restart does not read them as measured on all the traffic."""
    no_drafts: tuple[tuple[str, float], ...] = ()
    """(method, when) per method whose latest window ran without proposing one draft (its
    drafter found nothing to propose: n-gram on text it cannot match). Its acceptance is none
    (length 1, `acceptance_curves`) until it drafts again or the policy re-tests it
    (`policy.learn.retest_after_s`). The window is not folded into its counts, which keep what
    it accepted on traffic it could match: that is what a re-test bets on. Folded in as
    length 1, such windows kept n-gram predicted slower than no speculation after the traffic
    turned greedy again (the last phase of bench/results/real_vllm.md at 9b462f5: 0.722 of
    static K=5)."""
    no_draft_speed: tuple[tuple[str, float], ...] = ()
    """(method, log ratio) per method that has run a window without a draft: the log of its
    speed then over the plain server's physics prior at that window's load, blended in halves
    over such windows (`learn_no_draft_speed`). Read against what no speculation serves now
    (as its own windows measured it at that load, else as predicted), it is the share a
    re-test risks if the traffic is still unmatched (`policy.learn.retest_wait`): on vLLM's
    CPU build n-gram K=5 drafting nothing served about a quarter less than no speculation at
    concurrency 1 and 17% less at 32 (static arms of bench/results/real_vllm-shared-rounds6.md
    at 2938c8b; 29% and 28% in its rerun at 73dff18). Kept against the prior, not against the
    corrected prediction of the moment: at 73dff18 the first silent window at concurrency 32
    came before no speculation had run there and read a 9% loss, where the statics measured
    28%."""
    regime_changes: int = 0
    """Changes of the traffic's regime seen since `watched_since_s` (`note_regime`): the load
    stepping by REGIME_BATCH_STEP from where the last change left it, or the running method,
    settled on its config, going from drafting to drafting nothing. With the time watched they
    give the traffic's mean dwell in a regime (`policy.learn.regime_dwell_s`)."""
    regime_batch: float = 0.0
    """The batch where the last regime change (or the first window) left the load."""
    watched_since_s: float | None = None
    """When the first window the tuner learned from ended; None before it."""

    @classmethod
    def initial(
        cls,
        current: SpecConfig,
        now: float,
        priors: Mapping[str, AcceptanceCurve],
        task: str | None = None,
    ) -> TunerState:
        """`priors` per method (the published ones for `task`; without `task`, the task whose
        published priors they are, else chat)."""
        if task is not None and task not in TASKS:
            raise ConfigError("task", task, " | ".join(TASKS))
        return cls(
            current=current,
            since_s=now,
            acceptance=tuple(sorted((m, c.p, c.r) for m, c in priors.items())),
            prior_task=task if task is not None else task_of(priors),
        )

    def with_priors(self, priors: Mapping[str, AcceptanceCurve]) -> TunerState:
        """Methods of `priors` this state lacks start from their prior (candidates added)."""
        known = {m for m, _, _ in self.acceptance}
        added = [(m, c.p, c.r) for m, c in priors.items() if m not in known]
        if not added:
            return self
        return replace(self, acceptance=tuple(sorted((*self.acceptance, *added))))

    def task_weights(self) -> dict[str, float]:
        """The traffic's task weights as the tuner believes them."""
        return dict(zip(TASKS, self._mix(), strict=True))

    def acceptance_curves(self) -> dict[str, AcceptanceCurve]:
        """Each method's fitted chain; none accepted (p 0) for a method that drafted nothing."""
        silent = dict(self.no_drafts)
        return {
            method: replace(e.curve, p=0.0) if method in silent else e.curve
            for method, e in self._estimates().items()
        }

    def acceptance_sd(self) -> dict[str, float]:
        """Standard deviation of each method's p: the posterior's at the first draft position
        (the prior's spread until the method runs, shrinking with the drafts it measured); 0
        for a method that drafted nothing (the engine counted no draft at all)."""
        silent = dict(self.no_drafts)
        return {
            method: 0.0 if method in silent else e.p_sd for method, e in self._estimates().items()
        }

    def drafted_nothing_since(self, method: str) -> float | None:
        """When `method` last ran a window without one draft, while that still holds."""
        return dict(self.no_drafts).get(method)

    def learn_no_draft_speed(self, method: str, log_ratio: float) -> TunerState:
        """Blend `log_ratio` (the log of a window's speed while `method` drafted nothing over
        the plain server's physics prior) into `no_draft_speed`."""
        speeds = dict(self.no_draft_speed)
        # halves: one window's read is noisy, and the loss moves with the load
        speeds[method] = log_ratio if method not in speeds else (speeds[method] + log_ratio) / 2
        return replace(self, no_draft_speed=tuple(sorted(speeds.items())))

    def retest(self, methods: Collection[str]) -> TunerState:
        """Forget that `methods` drafted nothing: their counts speak for them again."""
        kept = tuple((m, t) for m, t in self.no_drafts if m not in methods)
        return self if kept == self.no_drafts else replace(self, no_drafts=kept)

    def learn_acceptance(self, config: SpecConfig, obs: Observation, now: float) -> TunerState:
        """Fold the running method's window into the task weights and its counts (a window
        without one draft marks it instead, `no_drafts`); the other methods' counts fade a
        little."""
        running = config.method if config.speculative else None
        state = self._fade_others(running)
        if running is None:
            return state
        batch = obs.running_requests
        k = config.k_for_batch(max(1, round(batch))) if _finite(batch) else config.max_k
        current = state._estimates().get(running)
        if current is None or k <= 0:
            return state
        length = obs.acceptance_length if _finite(obs.acceptance_length) else None
        drafts = obs.drafts
        survival = _trusted_survival(config, obs, k)
        generated = _tokens_generated(obs)
        if drafts == 0.0 and generated >= NO_DRAFT_MIN_TOKENS:
            # The drafter found nothing to propose (n-gram on sampled text: vLLM's CPU build
            # at temperature 0.7 drafted not once in bench/results/real_vllm.md): every token
            # came from a step of its own, as with an acceptance of none, on traffic unlike
            # the traffic its counts were measured on
            silent = dict(state.no_drafts)
            silent[running] = now
            return replace(state, no_drafts=tuple(sorted(silent.items())))
        if drafts is not None and not (_finite(drafts) and drafts > 0):
            return state  # nothing decoded, or a broken counter: nothing to learn
        window_drafts = drafts if drafts is not None else WINDOW_ESS
        if survival is not None:
            accepted, trials = counts_from_survival(survival, window_drafts)
        elif length is not None and length >= 1.0:
            accepted, trials = counts_from_length(length, k, current.prior_r, window_drafts)
        else:
            return state
        if length is not None:
            state = state._learn_task_mix(running, current, length, k)
        counts = dict(state._counts())
        counts[running] = absorb(counts.get(running), accepted, trials, state._mix())
        support = dict(state.acceptance_support)
        support[running] = min(support.get(running, 0.0) + 1, MAX_ACCEPTANCE_SUPPORT)
        return replace(
            state.retest([running]),
            acceptance_counts=_pack(counts),
            acceptance_support=tuple(sorted(support.items())),
        )

    def _learn_task_mix(self, method: str, current: Estimate, length: float, k: int) -> TunerState:
        prior = self._prior(method)
        if prior is None:
            return self
        low, high = current.curve.length_range(k, current.p_sd)
        variance = ((high - low) / 2) ** 2 + WINDOW_LENGTH_SD**2
        innovation = length - current.curve.expected_length(k)
        mix, strength = task_mix.update(
            self._mix(),
            self.task_strength,
            prior.task_lengths(k),
            innovation,
            variance,
            home=task_mix.initial_mix(TASKS, self.prior_task),
        )
        return replace(self, task_mix=mix, task_strength=strength)

    def _fade_others(self, running: str | None) -> TunerState:
        counts = self._counts()
        if not any(m != running for m in counts):
            return self
        faded = {m: c if m == running else idle(c) for m, c in counts.items()}
        return replace(self, acceptance_counts=_pack(faded))

    def _mix(self) -> tuple[float, ...]:
        return self.task_mix or task_mix.initial_mix(TASKS, self.prior_task)

    def _counts(self) -> dict[str, Counts]:
        return {m: Counts(a, t, w) for m, a, t, w in self.acceptance_counts}

    def _prior(self, method: str) -> MethodPrior | None:
        for m, p, r in self.acceptance:
            if m == method:
                return method_prior(m, AcceptanceCurve(p, r), self.prior_task)
        return None

    def _estimates(self) -> dict[str, Estimate]:
        return _estimates(self.acceptance, self.acceptance_counts, self._mix(), self.prior_task)

    def learn_traffic(self, obs: Observation, kv_capacity_tokens: int | None) -> TunerState:
        """Blend the window's prompt/output ratio, prompt per request and context per request
        into the estimates."""
        state = self
        prompt, output = obs.prompt_tokens_per_s, obs.generation_tokens_per_s
        if prompt is not None and output is not None and output > 0:
            state = replace(state, prefill_ratio=_blend(state.prefill_ratio, prompt / output))
        finished = obs.requests_per_s
        if prompt is not None and prompt > 0 and finished is not None and finished > 0:
            # Bounded: a window whose few completions lag its prefill reads a wild ratio.
            per_request = min(max(prompt / finished, 1.0), 1_000_000.0)
            state = replace(state, prompt_tokens=_blend(state.prompt_tokens, per_request))
        usage, batch = obs.kv_cache_usage, obs.running_requests
        if kv_capacity_tokens and usage and batch is not None and batch >= 1:
            # Bounded: the capacity is the catalog's estimate, not the engine's own figure.
            context = min(max(usage * kv_capacity_tokens / batch, 64.0), 65536.0)
            state = replace(state, context_tokens=_blend(state.context_tokens, context))
        return state

    def left_for_capacity(self, method: str, served: float, baseline: float = 0.0) -> TunerState:
        """The tuner leaves `method` because its capacity falls short of the load ahead, in a
        window where it served `served` output tokens/s and no speculation's capacity read
        `baseline` (0: not read; the latest exit replaces an older one)."""
        if not (served > 0 and math.isfinite(served)):
            return self
        known = baseline if baseline > 0 and math.isfinite(baseline) else 0.0
        return replace(self, capacity_exits=_with_exit(self.capacity_exits, method, served, known))

    def served(self, config: SpecConfig, throughput: float) -> TunerState:
        """A window in which `config` served `throughput` output tokens/s: a method left for
        capacity has at least what it serves."""
        state = self
        if config == self.current and throughput > self.served_peak:
            state = replace(state, served_peak=throughput)
        held = next((e for e in self.capacity_exits if e[0] == config.method), None)
        if held is None or not config.speculative or not throughput > held[1]:
            return state
        # The exit's baseline stays: learning reads no model, so no speculation's capacity
        # today is unknown here, and the next exit replaces both figures
        exits = _with_exit(self.capacity_exits, config.method, throughput, held[2])
        return replace(state, capacity_exits=exits)

    def measured_on_canary(self, config: SpecConfig) -> TunerState:
        """A trial's canary measured `config`; the main replicas did not move to it."""
        if config in self.canary_only:
            return self
        return replace(self, canary_only=(*self.canary_only, config))

    def ran_on_main(self, config: SpecConfig) -> TunerState:
        """The main replicas now run `config`: what it serves is measured on all the traffic."""
        if config not in self.canary_only:
            return self
        return replace(self, canary_only=tuple(c for c in self.canary_only if c != config))

    def note_regime(self, batch: float, went_silent: bool, now: float) -> TunerState:
        """Count a change of the traffic's regime in this window, if it shows one: the load
        stepped by REGIME_BATCH_STEP from `regime_batch`, or the running method went silent
        (`went_silent`: the caller knows whether it drafted in its previous window)."""
        if self.watched_since_s is None or self.regime_batch <= 0:
            since = now if self.watched_since_s is None else self.watched_since_s
            return replace(self, watched_since_s=since, regime_batch=batch)
        stepped = abs(math.log(batch / self.regime_batch)) >= math.log(REGIME_BATCH_STEP)
        if not (stepped or went_silent):
            return self
        return replace(
            self,
            regime_changes=self.regime_changes + 1,
            regime_batch=batch if stepped else self.regime_batch,
        )

    def remember_batch(self, batch: float) -> TunerState:
        return replace(self, recent_batches=(*self.recent_batches, batch)[-RECENT_WINDOWS:])

    def remember_demand(self, demand: float, window_s: float, half_life_s: float) -> TunerState:
        """One more window's offered demand: the peak so far, decayed over the window, or it."""
        decayed = self.demand_peak * math.pow(0.5, window_s / max(half_life_s, 1e-9))
        return replace(self, demand_peak=max(demand, decayed))

    def measured_residual(self, config: SpecConfig, batch: float) -> float | None:
        """The mean log residual `config`'s own windows measured in `batch`'s load bucket (None:
        it never served a window there)."""
        point = self._residual_point(config, residual_bucket(batch))
        return None if point is None else point.mean

    def _residual_point(self, config: SpecConfig, bucket: int) -> ResidualPoint | None:
        return next(
            (r for r in self.residuals if (r.config, r.log2_batch) == (config, bucket)), None
        )

    def learn_throughput(self, config: SpecConfig, batch: float, ratio: float) -> TunerState:
        """`ratio` is measured over prior throughput for `config` at `batch`."""
        if ratio <= 0 or not math.isfinite(ratio):
            return self
        bucket = residual_bucket(batch)
        residual = math.log(ratio)
        kept = [r for r in self.residuals if (r.config, r.log2_batch) != (config, bucket)]
        old = self._residual_point(config, bucket)
        if old is None:
            point = ResidualPoint(config, bucket, residual, 1.0)
        else:
            weight = old.weight + 1.0
            point = ResidualPoint(
                config,
                bucket,
                old.mean + (residual - old.mean) / weight,
                min(weight, MAX_RESIDUAL_WEIGHT),
            )
        kept.append(point)
        if len(kept) > MAX_RESIDUALS:
            kept.sort(key=lambda r: r.weight, reverse=True)
            kept = kept[:MAX_RESIDUALS]
        return replace(self, residuals=tuple(kept))

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "current": self.current.to_dict(),
            "since_s": self.since_s,
            "restarts": list(self.restarts),
            "acceptance": [list(a) for a in self.acceptance],
            "acceptance_support": [list(a) for a in self.acceptance_support],
            "acceptance_counts": [
                [m, list(a), list(t), list(w)] for m, a, t, w in self.acceptance_counts
            ],
            "prior_task": self.prior_task,
            "task_mix": list(self.task_mix),
            "task_strength": self.task_strength,
            "prefill_ratio": round(self.prefill_ratio, 4),
            "prompt_tokens": round(self.prompt_tokens, 1),
            "context_tokens": round(self.context_tokens, 1),
            "recent_batches": [round(b, 2) for b in self.recent_batches],
            "demand_peak": self.demand_peak,
            "capacity_exits": [[m, round(d, 1), round(b, 1)] for m, d, b in self.capacity_exits],
            "served_peak": self.served_peak,
            "canary_only": [c.to_dict() for c in self.canary_only],
            "last_window_s": self.last_window_s,
            "forecast_shortfall": self.forecast_shortfall,
            "no_drafts": [list(n) for n in self.no_drafts],
            "no_draft_speed": [[m, round(ratio, 4)] for m, ratio in self.no_draft_speed],
            "regime": [self.regime_changes, round(self.regime_batch, 2), self.watched_since_s],
            "residuals": [
                [r.config.to_dict(), r.log2_batch, r.mean, r.weight] for r in self.residuals
            ],
        }
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TunerState:
        body = json.loads(text)
        return cls(
            current=SpecConfig.from_dict(body["current"]),
            since_s=float(body["since_s"]),
            restarts=tuple(float(t) for t in body["restarts"]),
            acceptance=tuple((str(m), float(p), float(r)) for m, p, r in body["acceptance"]),
            acceptance_support=tuple(
                (str(m), float(n)) for m, n in body.get("acceptance_support", [])
            ),
            acceptance_counts=tuple(
                (str(m), _floats(a), _floats(t), _floats(w))
                for m, a, t, w in body.get("acceptance_counts", [])
            ),
            prior_task=_task(body.get("prior_task", "chat")),
            task_mix=_floats(body.get("task_mix", [])),
            task_strength=float(body.get("task_strength", INITIAL_TASK_STRENGTH)),
            prefill_ratio=float(body.get("prefill_ratio", 0.0)),
            prompt_tokens=float(body.get("prompt_tokens", 0.0)),
            context_tokens=float(body.get("context_tokens", 0.0)),
            recent_batches=tuple(float(b) for b in body.get("recent_batches", [])),
            demand_peak=float(body.get("demand_peak", 0.0)),
            capacity_exits=tuple(_capacity_exit(e) for e in body.get("capacity_exits", [])),
            served_peak=float(body.get("served_peak", 0.0)),
            canary_only=tuple(SpecConfig.from_dict(c) for c in body.get("canary_only", [])),
            last_window_s=_optional_float(body.get("last_window_s")),
            forecast_shortfall=bool(body.get("forecast_shortfall", False)),
            no_drafts=tuple((str(m), float(t)) for m, t in body.get("no_drafts", [])),
            no_draft_speed=tuple(
                (str(m), float(ratio)) for m, ratio in body.get("no_draft_speed", [])
            ),
            **_regime(body.get("regime", [0, 0.0, None])),
            residuals=tuple(
                ResidualPoint(SpecConfig.from_dict(c), int(b), float(m), float(w))
                for c, b, m, w in body["residuals"]
            ),
        )


def _blend(current: float, observed: float) -> float:
    """Moving estimate; the first observation (current 0: none yet) is taken as it is."""
    if current == 0.0:
        return observed
    return (1 - LEARNING_RATE) * current + LEARNING_RATE * observed


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _with_exit(
    exits: tuple[tuple[str, float, float], ...], method: str, served: float, baseline: float
) -> tuple[tuple[str, float, float], ...]:
    """`exits` with `method`'s replaced (or added), sorted by method."""
    kept = [e for e in exits if e[0] != method]
    return tuple(sorted([*kept, (method, served, baseline)]))


def _capacity_exit(value: Any) -> tuple[str, float, float]:
    # a state written before the baseline was kept holds [method, tok/s]
    method, served, *baseline = value
    return str(method), float(served), float(baseline[0]) if baseline else 0.0


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _regime(value: Any) -> dict[str, Any]:
    changes, batch, since = value
    return {
        "regime_changes": int(changes),
        "regime_batch": float(batch),
        "watched_since_s": _optional_float(since),
    }


def _task(value: Any) -> str:
    if value not in TASKS:
        raise ValueError(f"prior_task {value!r} is not one of {' | '.join(TASKS)}")
    return str(value)


def _tokens_generated(obs: Observation) -> float:
    """Output tokens the window generated (0 when unknown)."""
    rate = obs.generation_tokens_per_s
    return rate * obs.window_s if _finite(rate) and rate > 0 and _finite(obs.window_s) else 0.0


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _pack(counts: Mapping[str, Counts]) -> tuple[AcceptanceCounts, ...]:
    return tuple(sorted((m, c.accepted, c.trials, c.mix) for m, c in counts.items()))


def _trusted_survival(config: SpecConfig, obs: Observation, k: int) -> tuple[float, ...] | None:
    """The per-position shares (accepted at i / drafts) the counts may read. Under a schedule
    a window mixes drafts of several K, and position i's share then counts drafts that never
    offered it: only the positions every tier offers are kept, unless every draft offered all
    (mean offered K, (length - 1) / rate, at the deepest position)."""
    shares = obs.acceptance_per_position
    if not shares or not all(_finite(s) and 0.0 <= s <= 1.0 for s in shares):
        return None
    keep = min(len(shares), config.max_k)
    if config.schedule is not None:
        length, rate = obs.acceptance_length, obs.acceptance_rate
        offered = (length - 1.0) / rate if _finite(length) and _finite(rate) and rate else None
        if offered is None or offered < keep - 0.01:
            keep = min([keep, *(t for *_, t in config.schedule if t > 0)])
    return tuple(shares[:keep]) if keep > 0 else None


@functools.lru_cache(maxsize=64)
def _estimates(
    acceptance: tuple[tuple[str, float, float], ...],
    counts: tuple[AcceptanceCounts, ...],
    mix: tuple[float, ...],
    prior_task: str,
) -> dict[str, Estimate]:
    # Cached: the tick asks for the same posteriors several times (learn, propose, reasons).
    measured = {m: Counts(a, t, w) for m, a, t, w in counts}
    return {
        m: estimate(method_prior(m, AcceptanceCurve(p, r), prior_task), measured.get(m), mix)
        for m, p, r in acceptance
    }
