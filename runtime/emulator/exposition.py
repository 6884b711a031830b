"""The emulated engine's /metrics, in vLLM 0.32's or SGLang 0.5.23's exact names and semantics.

Contract: an exposition receives every step outcome and every finished request and renders
Prometheus text with the metric names, types, labels, bucket boundaries and update rules of its
engine (sources: vllm/v1/metrics/loggers.py and buckets.py; sglang/srt/observability/
metrics_collector.py and managers/scheduler_components/metrics_reporter.py; the SGLang dialect is
checked against a live SGLang server by tests/contract/test_sglang_server.py):
- vLLM: gauges refreshed every step; inter-token latency observed once per request per engine
  step (so with speculation it is per step, not per token); spec-decode counters per draft;
  when a request finishes, its phase times (vllm/v1/metrics/stats.py): queue (arrival to first
  scheduled), prefill (first scheduled to first token), decode (first to last token) and
  inference (first scheduled to last token), preemptions included.
- SGLang: the scheduler's gauges (labels model_name, engine_type, tp/pp/moe_ep rank) exist from
  startup at 0. Every SGLANG_WINDOW_STEPS decode batches they are all published: running,
  queue, token usage, throughput over the window, and acceptance length = (accepted drafts + one
  token per request per batch) / (requests x batches) in the window, rate, steps, draft tokens.
  Every prefill batch republishes running (the decode batch), queue, usage and the last
  throughput (0 once 30 s old); an idle scheduler whose running gauge is stale publishes 0 load.
  The acceptance gauges keep their last window's value in between and when idle. The tokenizer
  side (labels model_name, engine_type, is_streaming where SGLang has it) counts prompt and
  generation tokens and verify calls when a request finishes, and observes inter-token latency
  per token for streamed requests only (here at the request's end, from its per-step gaps).
  The scheduler observes each request's queue time (arrival to first forward) when it is first
  scheduled.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from specpilot.runtime.emulator.core import EngineCore, Request, StepOutcome

VLLM_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
VLLM_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
VLLM_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
VLLM_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_E2E_BUCKETS = (*SGLANG_TTFT_BUCKETS, 600, 1200, 1800, 2400)
SGLANG_ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
SGLANG_QUEUE_BUCKETS = (
    0.0,
    0.001,
    0.005,
    0.010,
    0.050,
    0.100,
    0.200,
    0.500,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
)
SGLANG_WINDOW_STEPS = 40
SGLANG_THROUGHPUT_STALE_S = 30.0


class Exposition(Protocol):
    def record_step(self, outcome: StepOutcome, core: EngineCore) -> None: ...

    def record_finished(self, request: Request, streaming: bool) -> None: ...

    def record_aborted(self, request: Request, core: EngineCore) -> None:
        """A request dropped before it finished (its client went away)."""
        ...

    def render(self) -> bytes: ...


class _Latencies:
    """Per-request histograms both engines keep (TTFT, end-to-end, time per output token)."""

    registry: CollectorRegistry
    _ttft: Histogram
    _e2e: Histogram
    _tpot: Histogram
    _last_emit: dict[str, float]

    def _record_latencies(self, labels: dict[str, str], request: Request) -> None:
        self._last_emit.pop(request.request_id, None)
        if request.first_token_s is not None:
            self._ttft.labels(**labels).observe(request.first_token_s - request.arrival_s)
        if request.finished_s is not None:
            self._e2e.labels(**labels).observe(request.finished_s - request.arrival_s)
        tpot = request.time_per_output_token_s
        if tpot is not None:
            self._tpot.labels(**labels).observe(tpot)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class VllmExposition(_Latencies):
    def __init__(self, model_name: str, num_positions: int = 0) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r)

        self._running = gauge("vllm:num_requests_running", "Requests in model execution.")
        self._waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be processed.")
        self._kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self._prompt = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self._generated = counter("vllm:generation_tokens", "Generation tokens processed.")
        self._preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self._drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self._draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.")
        self._accepted = counter("vllm:spec_decode_num_accepted_tokens", "Accepted tokens.")
        self._per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*names, "position"],
            registry=r,
        )
        self._ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", VLLM_TTFT_BUCKETS
        )
        self._itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency.", VLLM_ITL_BUCKETS
        )
        self._tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Time per output token per request.",
            VLLM_ITL_BUCKETS,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", VLLM_LATENCY_BUCKETS
        )
        self._iteration = histogram(
            "vllm:iteration_tokens_total", "Tokens per engine step.", VLLM_ITERATION_BUCKETS
        )
        self._phases = {
            phase: histogram(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent in {phase.upper()} phase for request.",
                VLLM_LATENCY_BUCKETS,
            )
            for phase in ("queue", "inference", "prefill", "decode")
        }
        self._labels = labels
        self._last_emit: dict[str, float] = {}
        self._scheduled: dict[str, float] = {}
        # vLLM creates every series at startup (per-position ones for each of the K positions)
        for metric in (
            self._running,
            self._waiting,
            self._kv,
            self._prompt,
            self._generated,
            self._preemptions,
            self._ttft,
            self._itl,
            self._tpot,
            self._e2e,
            self._iteration,
            *self._phases.values(),
        ):
            metric.labels(**labels)
        if num_positions:
            for metric in (self._drafts, self._draft_tokens, self._accepted):
                metric.labels(**labels)
            for position in range(num_positions):
                self._per_pos.labels(**labels, position=str(position))

    def record_step(self, outcome: StepOutcome, core: EngineCore) -> None:
        lab = self._labels
        end = outcome.start_s + outcome.duration_s
        self._running.labels(**lab).set(len(core.running))
        self._waiting.labels(**lab).set(len(core.waiting))
        self._kv.labels(**lab).set(core.kv_usage)
        self._prompt.labels(**lab).inc(outcome.prefill_tokens)
        self._generated.labels(**lab).inc(sum(outcome.emitted.values()))
        self._preemptions.labels(**lab).inc(outcome.preempted)
        self._iteration.labels(**lab).observe(
            outcome.prefill_tokens + sum(outcome.emitted.values())
        )
        if outcome.drafts:
            self._drafts.labels(**lab).inc(outcome.drafts)
            self._draft_tokens.labels(**lab).inc(outcome.draft_tokens)
            self._accepted.labels(**lab).inc(outcome.accepted)
            for position, count in enumerate(outcome.accepted_per_position):
                self._per_pos.labels(**lab, position=str(position)).inc(count)
        for request_id in outcome.emitted:
            previous = self._last_emit.get(request_id)
            if previous is not None:
                self._itl.labels(**lab).observe(end - previous)
            self._last_emit[request_id] = end
        # vLLM keeps a request's first SCHEDULED time; a preempted one keeps it
        for request in (*core.running, *outcome.finished):
            self._scheduled.setdefault(request.request_id, outcome.start_s)

    def record_aborted(self, request: Request, core: EngineCore) -> None:
        # vLLM's scheduler stats follow the abort; no latency is observed for the request
        self._last_emit.pop(request.request_id, None)
        self._scheduled.pop(request.request_id, None)
        lab = self._labels
        self._running.labels(**lab).set(len(core.running))
        self._waiting.labels(**lab).set(len(core.waiting))
        self._kv.labels(**lab).set(core.kv_usage)

    def record_finished(self, request: Request, streaming: bool) -> None:
        self._record_latencies(self._labels, request)
        scheduled = self._scheduled.pop(request.request_id, None)
        first, last = request.first_token_s, request.finished_s
        if scheduled is None or first is None or last is None:
            return
        phases = {
            "queue": scheduled - request.arrival_s,
            "prefill": first - scheduled,
            "decode": last - first,
            "inference": last - scheduled,
        }
        for phase, seconds in phases.items():
            self._phases[phase].labels(**self._labels).observe(seconds)


class SglangExposition(_Latencies):
    """SGLang 0.5.23's /metrics, as checked against a live server (tests/contract/
    test_sglang_server.py): scheduler gauges carry the scheduler's five labels; the tokenizer
    side's counters and histograms only model_name and engine_type (plus is_streaming on the
    per-request ones) and move when a request finishes."""

    def __init__(self, model_name: str, max_k: int = 0) -> None:
        self.registry = CollectorRegistry()
        tokenizer = {"model_name": model_name, "engine_type": "unified"}
        scheduler = {**tokenizer, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self._labels = scheduler
        self._tokenizer_labels = tokenizer
        self._speculative = max_k > 0
        names = list(scheduler)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r)

        self._running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self._queue = gauge("sglang:num_queue_reqs", "Requests in the waiting queue.")
        self._usage = gauge("sglang:token_usage", "The token usage.")
        self._throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self._accept_length = gauge("sglang:spec_accept_length", "Mean acceptance length.")
        self._accept_rate = gauge("sglang:spec_accept_rate", "Speculative acceptance rate.")
        self._num_steps = gauge("sglang:spec_num_steps", "Active speculative_num_steps.")
        self._num_draft_tokens = gauge(
            "sglang:spec_num_draft_tokens", "Active speculative_num_draft_tokens."
        )
        self._queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            names,
            buckets=SGLANG_QUEUE_BUCKETS,
            registry=r,
        )
        streaming = [*tokenizer, "is_streaming"]
        self._generated = Counter(
            "sglang:generation_tokens", "Generation tokens.", streaming, registry=r
        )
        self._prompt = Counter("sglang:prompt_tokens", "Prefill tokens.", streaming, registry=r)
        self._verify = Counter(
            "sglang:spec_verify_calls", "Verify calls.", list(tokenizer), registry=r
        )
        self._itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            list(tokenizer),
            buckets=SGLANG_ITL_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token.",
            streaming,
            buckets=SGLANG_TTFT_BUCKETS,
            registry=r,
        )
        self._tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT.",
            streaming,
            buckets=SGLANG_ITL_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end latency.",
            streaming,
            buckets=SGLANG_E2E_BUCKETS,
            registry=r,
        )
        # the scheduler publishes every gauge once at startup (zeros)
        for metric in (
            self._running,
            self._queue,
            self._usage,
            self._throughput,
            self._accept_length,
            self._accept_rate,
            self._num_steps,
            self._num_draft_tokens,
        ):
            metric.labels(**scheduler)
        self._decode_steps = 0
        self._last_decode_report: float | None = None
        self._throughput_value = 0.0
        self._running_value = 0
        self._window_tokens = 0
        self._window_request_steps = 0
        self._window_accepted = 0
        self._window_draft_tokens = 0
        self._last_emit: dict[str, float] = {}
        self._verifies: dict[str, int] = {}
        self._intervals: dict[str, list[tuple[float, int]]] = {}
        self._scheduled: set[str] = set()

    def record_step(self, outcome: StepOutcome, core: EngineCore) -> None:
        end = outcome.start_s + outcome.duration_s
        if self._last_decode_report is None:
            self._last_decode_report = outcome.start_s
        for request in (*core.running, *outcome.finished):  # one sample per request
            if request.request_id not in self._scheduled:
                self._scheduled.add(request.request_id)
                wait = outcome.start_s - request.arrival_s
                self._queue_time.labels(**self._labels).observe(wait)
        for request_id, tokens in outcome.emitted.items():
            previous = self._last_emit.get(request_id)
            if previous is not None and tokens:  # a decode step (the first token is prefill's)
                self._intervals.setdefault(request_id, []).append((end - previous, tokens))
                if outcome.drafts:
                    self._verifies[request_id] = self._verifies.get(request_id, 0) + 1
            self._last_emit[request_id] = end
        if outcome.prefill_tokens:
            # every prefill batch republishes load; the throughput decays after 30 s
            if end - self._last_decode_report > SGLANG_THROUGHPUT_STALE_S:
                self._throughput_value = 0.0
            self._publish_load(outcome.decode_batch, core)
        if outcome.decode_batch:
            self._decode_window(outcome, core, end)
        if core.idle and self._running_value != 0:
            # the idle scheduler republishes as soon as its running gauge is stale
            self._throughput_value = 0.0
            self._publish_load(0, core)

    def _decode_window(self, outcome: StepOutcome, core: EngineCore, end: float) -> None:
        """Every SGLANG_WINDOW_STEPS decode batches: load, throughput and acceptance over the
        window (SGLang counts accepted drafts plus one token per request per batch)."""
        self._decode_steps += 1
        self._window_tokens += outcome.accepted + outcome.decode_batch
        self._window_request_steps += outcome.decode_batch
        self._window_accepted += outcome.accepted
        self._window_draft_tokens += outcome.draft_tokens
        if self._decode_steps % SGLANG_WINDOW_STEPS:
            return
        lab = self._labels
        gap = end - (self._last_decode_report or outcome.start_s)
        self._last_decode_report = end
        self._throughput_value = self._window_tokens / max(gap, 1e-9)
        self._publish_load(outcome.decode_batch, core)
        length = rate = 0.0
        steps = drafts = 0
        if self._speculative:
            length = self._window_tokens / self._window_request_steps
            rate = self._window_accepted / max(self._window_draft_tokens, 1)
            steps, drafts = outcome.k, outcome.k + 1
        self._accept_length.labels(**lab).set(length)
        self._accept_rate.labels(**lab).set(rate)
        self._num_steps.labels(**lab).set(steps)
        self._num_draft_tokens.labels(**lab).set(drafts)
        self._window_tokens = self._window_request_steps = 0
        self._window_accepted = self._window_draft_tokens = 0

    def _publish_load(self, running: int, core: EngineCore) -> None:
        lab = self._labels
        self._running_value = running
        self._running.labels(**lab).set(running)
        self._queue.labels(**lab).set(len(core.waiting))
        self._usage.labels(**lab).set(core.kv_usage)
        self._throughput.labels(**lab).set(self._throughput_value)

    def render(self) -> bytes:
        """Like SGLang's multiprocess collector: no `_created` series."""
        return generate_latest(_WithoutCreated(self.registry))

    def record_aborted(self, request: Request, core: EngineCore) -> None:
        for per_request in (self._last_emit, self._verifies, self._intervals):
            per_request.pop(request.request_id, None)
        self._scheduled.discard(request.request_id)
        if core.idle and self._running_value != 0:
            self._publish_load(0, core)  # as the idle scheduler does once its gauge is stale

    def record_finished(self, request: Request, streaming: bool) -> None:
        tokenizer = self._tokenizer_labels
        labels = {**tokenizer, "is_streaming": str(streaming).lower()}
        self._scheduled.discard(request.request_id)
        self._prompt.labels(**labels).inc(request.prompt_tokens)
        self._generated.labels(**labels).inc(request.generated)
        verifies = self._verifies.pop(request.request_id, 0)
        if verifies:
            self._verify.labels(**tokenizer).inc(verifies)
        intervals = self._intervals.pop(request.request_id, [])
        if streaming:  # only streamed chunks reach SGLang's tokenizer one by one
            for interval, tokens in intervals:
                for _ in range(tokens):  # per token: the chunk's interval split evenly
                    self._itl.labels(**tokenizer).observe(interval / tokens)
        self._record_latencies(labels, request)


class _WithoutCreated:
    """A registry's metric families minus their `_created` samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def exposition_for(engine: str, model_name: str, num_positions: int) -> Exposition:
    if engine == "vllm":
        return VllmExposition(model_name, num_positions)
    return SglangExposition(model_name, max_k=num_positions)
