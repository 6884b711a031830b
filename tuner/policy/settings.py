"""The policy's settings: the space it searches and the prices and limits it acts under.

Contract: `TunerSettings` is frozen data with a default for every knob but the candidates; the
policy reads it and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specpilot.tuner.spec_config import SpecConfig

DEFAULT_MAX_BATCH = 256
"""The batch limit when the engine's is not known: vLLM 0.32's default max-num-seqs on GPUs under
70 GiB and on A100 (1024 on H100, H200 and larger; 128 on CPU)."""

Objective = Literal["latency", "throughput", "goodput"]
AcceptanceModel = Literal["posterior", "moving-average"]
ResidualModel = Literal["gp", "offset"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerSettings:
    candidates: tuple[SpecConfig, ...]
    """The space: every allowed config (static K), already filtered by engine capability."""
    objective: Objective = "latency"
    """latency: the least per-token latency at the offered load among configs whose capacity
    keeps up with the load ahead (`policy.latency`); throughput: the most tokens/s at the
    current batch; goodput: throughput among configs meeting the SLO (slo_* below)."""
    capacity_margin: float = 0.2
    """Latency objective: the spare capacity a config must keep over the load ahead. Traffic
    is bursty within a window, and a batch near its capacity waits in queue."""
    entry_caution_sd: float = 0.5
    """Latency objective: how many sds down a speculative config that never ran here has its
    capacity read, to be entered and to price its overload (its capacity is the physics
    prior's guess, which hides what a world hides from a speculative path: its drafter, its
    verify overhead, its acceptance), while the running config keeps up with its load; under
    an overload at least `latency_proposal.OVERLOAD_ENTRY_CAUTION_SD`. 0 reads the mean. The
    figures for 0, 0.5 and 1 are in bench/results/entry_caution.md and the yardstick's
    results."""
    near_tie: float = 0.01
    """Latency objective: configs predicted within this share of the fastest for users count
    as equally fast, and of those the one with the most capacity to spare over the load ahead
    is chosen (a schedule that runs the same K as its plain config at today's batch but drops
    K at larger ones, so the next step up of the load does not catch it short). 0 takes the
    strict fastest (the bench's `specpilot:strict-fastest` variant); what 0.01 changed against
    it on the yardstick is in bench/results/strict-fastest-*.json and issue 11's notes of stops
    47 and 48."""
    rollout_share: float = 1.0
    """The share of the replicas serving while a rollout replaces them: (replicas -
    maxUnavailable) / replicas, 1 with a surge (maxUnavailable 0). Below 1 the replicas still
    up carry the whole load until the rollout ends, and the pods that came up first run the
    target: a config is entered only if it holds the load ahead, with the capacity margin,
    over this share (`entry_margin`)."""
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
    """A trial's largest expected loss, relative to the running rate and spread over the
    expected dwell (its expected shortfall while it runs, see `proposal.explore`)."""
    window_s: float = 60.0
    """Seconds between decisions (the spacing of the batches the forecast extrapolates)."""
    exploration: float = 1.0
    """Weight on a trial's expected improvement (0 disables exploration). The control loop
    sets it to 0 where a trial would take all of the traffic (no canary: operator/loop.py);
    the operator and the bench set it to 0 unless the SpecDeployment's `tuning.explore` asks
    for trials (in the bench's 4-replica ablations they paid for themselves in no world)."""
    trial_share: float = 1.0
    """The share of the traffic a trial runs on: 1/N for a one-replica canary in one of N main
    replicas' place, 1/(N+1) beside them (the control loop sets it from the actuator). A
    trial's expected loss is scaled by it, and a canary that disappoints is deleted without
    changing the main replicas' config, so below 1 a trial costs a restart of theirs only when
    it is promoted."""
    excluded: tuple[SpecConfig, ...] = ()
    """Configs not to move to, synthesised schedules included (the control loop's backed-off
    configs: a schedule rejected on a canary is synthesised again on the next tick)."""
    unproven: tuple[SpecConfig, ...] = ()
    """Configs whose capacity is read one sd down though they have a measured residual: those
    only a canary ran (the control loop's), and a trial's config while its canary is judged.
    A canary measures at its own batch, a share of the traffic, not at the batch a backlog
    would drive the main replicas to; read at the mean there, the judge promoted EAGLE-3 into
    overload at 4 replicas."""
    acceptance_model: AcceptanceModel = "posterior"
    """posterior: per-position Beta posteriors learning (p, r) and the task mix; moving-average:
    the running method's length averaged at a fixed rate (an ablation, `policy.ablation`)."""
    residual_model: ResidualModel = "gp"
    """gp: the shared offset, each method's level and the fitted GP over the residuals;
    offset: the shared offset alone (an ablation: every config corrected alike)."""
    lumpy_prefill: bool = True
    """Price prefill in lumps of the traffic's mean prompt (`StepCost.serving_step_time`), not
    spread over every step (False: `specpilot:averaged-prefill` in `specpilot bench`). The
    lumped physics is the more accurate (bench/results/lumpy_prefill.md): spread evenly, it
    underrates a narrow decode step carrying a whole prompt more than a wide verify step, so
    the correction learned on no speculation makes EAGLE-3 look slower than it is, and keeps
    speculation off at loads where it pays."""
    warm_switches: bool = False
    """A switch moves the traffic onto an engine already up and serving warm (a pool of
    servers, one per candidate): the first window wholly after it measures the config's speed.
    False (a restart or a rollout's new pods): that window is a cold engine's, and speed is
    learned from the second (`policy.learn`). On the real vLLM bench's shared servers
    (bench/results/real_vllm-shared-repeat.md at 9a06d0a) the move to ngram K=5 at
    concurrency 1 was predicted at 1059.8 tok/s on the chat prior, its first window served
    1259.3 and was learned, and the next window's prediction read 1331.9 against 1341.6
    served (phases there are 3 windows long: learning from the second window only would leave
    one of them unlearned)."""
    max_batch: int = DEFAULT_MAX_BATCH
    """The engine's max-num-seqs (SGLang: max-running-requests): the most concurrent requests a
    forecast can reach, and the batch each config's capacity is read at."""
    context_tokens: float = 1024.0
    """Mean context per running request, unless the KV usage can tell (kv_capacity_tokens)."""
    kv_capacity_tokens: int | None = None
    """KV tokens the engine holds (e.g. `StepCost.kv_capacity_tokens()` for a catalog GPU);
    with it the context per request is read from the engine's KV usage. None where the
    capacity is not known (a CPU, a measured fit): context_tokens is used."""

    def entry_margin(self) -> float:
        """The spare capacity a config must have over the load ahead to be entered: the
        capacity margin, on the replicas a rollout leaves serving (with none left, a single
        replica, the downtime is the restart's price, not a margin). The margin is for the
        traffic's bursts within a window, which the replicas left serving see too."""
        if not 0.0 < self.rollout_share < 1.0:
            return self.capacity_margin
        return (1.0 + self.capacity_margin) / self.rollout_share - 1.0
