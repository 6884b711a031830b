"""The emulated engine's /metrics, in vLLM 0.32's or SGLang 0.5.23's exact names and semantics.

Contract: an exposition receives every step outcome and every finished request and renders
Prometheus text with the metric names, types, labels, bucket boundaries and update rules of its
engine (sources: vllm/v1/metrics/loggers.py and buckets.py; sglang/srt/observability/
metrics_collector.py):
- vLLM: gauges refreshed every step; inter-token latency observed once per request per engine
  step (so with speculation it is per step, not per token); spec-decode counters per draft.
- SGLang: gauges (running, queue, token usage, throughput, accept length/rate, steps) refreshed
  every SGLANG_WINDOW_STEPS decode steps over that window; inter-token latency per token.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
SGLANG_WINDOW_STEPS = 40


class Exposition(Protocol):
    def record_step(self, outcome: StepOutcome, core: EngineCore) -> None: ...

    def record_finished(self, request: Request, streaming: bool) -> None: ...

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
        self._labels = labels
        self._last_emit: dict[str, float] = {}
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

    def record_finished(self, request: Request, streaming: bool) -> None:
        self._record_latencies(self._labels, request)


class SglangExposition(_Latencies):
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        names = list(labels)
        r = self.registry
        self._labels = labels
        self._running = Gauge("sglang:num_running_reqs", "Running requests.", names, registry=r)
        self._queue = Gauge("sglang:num_queue_reqs", "Queued requests.", names, registry=r)
        self._usage = Gauge("sglang:token_usage", "Token usage.", names, registry=r)
        self._throughput = Gauge("sglang:gen_throughput", "Generation tok/s.", names, registry=r)
        self._accept_length = Gauge(
            "sglang:spec_accept_length", "Accept length.", names, registry=r
        )
        self._accept_rate = Gauge("sglang:spec_accept_rate", "Accept rate.", names, registry=r)
        self._num_steps = Gauge("sglang:spec_num_steps", "Speculative steps.", names, registry=r)
        self._generated = Counter(
            "sglang:generation_tokens", "Generation tokens.", names, registry=r
        )
        self._prompt = Counter("sglang:prompt_tokens", "Prefill tokens.", names, registry=r)
        self._verify = Counter("sglang:spec_verify_calls", "Verify calls.", names, registry=r)
        self._itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Inter-token latency.",
            names,
            buckets=SGLANG_ITL_BUCKETS,
            registry=r,
        )
        streaming_names = [*names, "is_streaming"]
        self._ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token.",
            streaming_names,
            buckets=SGLANG_TTFT_BUCKETS,
            registry=r,
        )
        self._tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT.",
            streaming_names,
            buckets=SGLANG_ITL_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end latency.",
            streaming_names,
            buckets=SGLANG_E2E_BUCKETS,
            registry=r,
        )
        for metric in (
            self._running,
            self._queue,
            self._usage,
            self._throughput,
            self._generated,
            self._prompt,
            self._itl,
        ):
            metric.labels(**labels)
        self._window_steps = 0
        self._window_tokens = 0
        self._window_time = 0.0
        self._window_accepted = 0
        self._window_drafts = 0
        self._window_draft_tokens = 0
        self._last_emit: dict[str, float] = {}

    def record_step(self, outcome: StepOutcome, core: EngineCore) -> None:
        lab = self._labels
        end = outcome.start_s + outcome.duration_s
        emitted = sum(outcome.emitted.values())
        self._generated.labels(**lab).inc(emitted)
        self._prompt.labels(**lab).inc(outcome.prefill_tokens)
        if outcome.drafts:
            self._verify.labels(**lab).inc(outcome.drafts)
        for request_id, tokens in outcome.emitted.items():
            previous = self._last_emit.get(request_id)
            if previous is not None and tokens:
                for _ in range(tokens):  # SGLang observes per token
                    self._itl.labels(**lab).observe((end - previous) / tokens)
            self._last_emit[request_id] = end
        if not outcome.decode_batch:
            return
        self._window_steps += 1
        self._window_tokens += emitted
        self._window_time += outcome.duration_s
        self._window_accepted += outcome.accepted
        self._window_drafts += outcome.drafts
        self._window_draft_tokens += outcome.draft_tokens
        if self._window_steps < SGLANG_WINDOW_STEPS:
            return
        self._running.labels(**lab).set(len(core.running))
        self._queue.labels(**lab).set(len(core.waiting))
        self._usage.labels(**lab).set(core.kv_usage)
        self._throughput.labels(**lab).set(self._window_tokens / max(self._window_time, 1e-9))
        self._num_steps.labels(**lab).set(outcome.k)
        if self._window_drafts:
            self._accept_length.labels(**lab).set(1 + self._window_accepted / self._window_drafts)
            self._accept_rate.labels(**lab).set(
                self._window_accepted / max(self._window_draft_tokens, 1)
            )
        self._window_steps = self._window_tokens = 0
        self._window_accepted = self._window_drafts = self._window_draft_tokens = 0
        self._window_time = 0.0

    def record_finished(self, request: Request, streaming: bool) -> None:
        self._record_latencies({**self._labels, "is_streaming": str(streaming).lower()}, request)


def exposition_for(engine: str, model_name: str, num_positions: int) -> Exposition:
    if engine == "vllm":
        return VllmExposition(model_name, num_positions)
    return SglangExposition(model_name)
