"""A real SGLang 0.5.23 server on this CPU, started from the command line SpecPilot's adapter
renders, for the live contract tests.

Contract: `ServerPool.get(name)` returns a ready server for one of `CONFIGS`, started as
`SGLANG.program(python) + SGLANG.render(config, launch)`. The test adds only what a CPU needs,
as `LaunchSettings.extra_args` and environment: `--device cpu`, an attention backend, no CUDA
graphs, bf16 and a small KV pool; `SGLANG_USE_CPU_ENGINE=1`; and the test-only `sgl_kernel`
stand-in on PYTHONPATH (tests/contract/engine_side/sgl_kernel_standin). NGRAM verifies a draft
tree, which only SGLang's intel_amx attention backend does on CPU, so speculative servers ask
for it and the stand-in tells SGLang this CPU has AMX (its model layers still run plain torch).
An idle SGLang scheduler polls and holds one of the two cores, so the pool keeps at most one
server alive: asking for another stops the current one.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.scrape import Snapshot, fetch_snapshot
from specpilot.tuner import SpecConfig

from conftest import (
    ENGINE_SIDE,
    MODELS,
    OFFLINE_ENV,
    ROOT,
    SGLANG_PYTHON,
    Process,
    free_port,
    require,
    start,
    wait_http_ok,
)

SGLANG = get_adapter("sglang")
SERVED = "tiny"
STANDIN = ENGINE_SIDE / "sgl_kernel_standin"
CONFIGS: dict[str, SpecConfig] = {
    "plain": SpecConfig(),
    "ngram-k3": SpecConfig(method="ngram", num_speculative_tokens=3),
    "ngram-k5": SpecConfig(method="ngram", num_speculative_tokens=5),
}
# Greedy, repetitive prompts: the random tiny model falls into loops the n-gram table matches.
PROMPTS = (
    "the quick brown fox jumps over the lazy dog " * 4,
    "one two three four five six seven eight nine ten " * 3,
    "to be or not to be that is the question " * 3,
)


def cpu_flags(config: SpecConfig) -> tuple[str, ...]:
    backend = "intel_amx" if config.speculative else "torch_native"
    return (
        "--device",
        "cpu",
        "--attention-backend",
        backend,
        "--disable-cuda-graph",
        "--dtype",
        "bfloat16",
        "--mem-fraction-static",
        "0.15",
        "--max-total-tokens",
        "65536",
    )


@dataclass
class LiveServer:
    name: str
    config: SpecConfig
    url: str
    process: Process
    command: list[str]


@dataclass(frozen=True)
class Greedy:
    """The plain server's greedy output for one prompt, with its two likeliest tokens and their
    log-probabilities at every output position."""

    output_ids: list[int]
    top2: list[list[tuple[float, int]]]

    def first_difference(self, other: Sequence[int]) -> int | None:
        """The first position where `other` leaves this output; None if it never does."""
        for position, (mine, theirs) in enumerate(zip(self.output_ids, other, strict=True)):
            if mine != theirs:
                return position
        return None

    def tie_gap(self, position: int, token: int) -> float | None:
        """How far below this position's likeliest token `token` is (in nats), when it is one
        of the two likeliest; None when it is not (not a tie, whatever the numerics)."""
        top = self.top2[position]
        for logprob, candidate in top:
            if candidate == token:
                return top[0][0] - logprob
        return None


@dataclass
class ServerPool:
    """At most one live SGLang server; `get` starts the named one, stopping any other."""

    workdir: Path
    live: LiveServer | None = None
    greedy_outputs: dict[str, Greedy] = field(default_factory=dict)

    def get(self, name: str) -> LiveServer:
        live = self.live
        if live is not None and live.name == name and live.process.popen.poll() is None:
            return live
        self.stop()
        config = CONFIGS[name]
        port = free_port()
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        launch = LaunchSettings(
            model=str(require(MODELS / "llama")),
            served_model_name=SERVED,
            host="127.0.0.1",
            port=port,
            sidecar_dir=str(folder),
            extra_args=cpu_flags(config),
        )
        for path, content in SGLANG.sidecar_files(config, launch).items():
            Path(path).write_text(content)
        command = SGLANG.program(str(require(SGLANG_PYTHON))) + SGLANG.render(config, launch)
        env = {
            **OFFLINE_ENV,
            "SGLANG_USE_CPU_ENGINE": "1",
            # the n-gram matcher is compiled with g++ on first start; keep it between runs
            "SGLANG_CACHE_DIR": str(ROOT / ".cache/sglang-jit"),
            "PYTHONPATH": str(STANDIN),
            "SPECPILOT_STANDIN_CLAIM_AMX": "1" if config.speculative else "0",
        }
        process = start(command, folder / "server.log", env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http_ok(process, f"{url}/health", timeout_s=900)
        except BaseException:
            process.stop()
            raise
        self.live = LiveServer(name, config, url, process, command)
        return self.live

    def stop(self) -> None:
        if self.live is not None:
            self.live.process.stop()
            self.live = None

    def reference_outputs(self) -> dict[str, Greedy]:
        """The plain server's greedy outputs for PROMPTS (started if not yet measured)."""
        if not self.greedy_outputs:
            plain = self.get("plain")
            with httpx.Client(timeout=300) as client:
                for prompt in PROMPTS:
                    result = generate(client, plain.url, prompt, 48, top_logprobs=2)
                    self.greedy_outputs[prompt] = Greedy(
                        result["output_ids"],
                        [
                            [(float(lp), int(token)) for lp, token, *_ in top]
                            for top in result["meta_info"]["output_top_logprobs"]
                        ],
                    )
        return self.greedy_outputs


def generate(
    client: httpx.Client,
    url: str,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_logprobs: int = 0,
    stream: bool = False,
) -> dict[str, Any]:
    """SGLang's native /generate; its meta_info carries the per-request speculative counts,
    and with `top_logprobs` the likeliest tokens at each output position
    (meta_info["output_top_logprobs"]: [logprob, token id, text] lists). With `stream` the
    answer comes as server-sent events and the last one (the finished request's) is returned.

    Why streaming matters to a test of TPOT: SGLang 0.5.23 stamps a non-streamed request's
    first token in the scheduler and puts it on the tokenizer's clock through the two
    processes' time() - perf_counter() differences, the tokenizer's taken only when it started
    (req_time_stats.py: __setstate__, calibrate_time_diff). A wall clock stepped or slewed since
    then (NTP on a CI VM) moves the stamp; once it lands outside the request's life the
    tokenizer drops it (_get_scheduler_first_token_time), the decode time reads 0 and no TPOT
    is observed (CI at 43fe150 read none for 24 requests). A streamed request's first token is
    stamped on the tokenizer's own clock, so its TPOT is observed whatever the wall clock did."""
    body: dict[str, Any] = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature},
        "stream": stream,
    }
    if top_logprobs:
        body |= {"return_logprob": True, "top_logprobs_num": top_logprobs}
    if not stream:
        response = client.post(f"{url}/generate", json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result
    last: dict[str, Any] | None = None
    with client.stream("POST", f"{url}/generate", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            payload = line.removeprefix("data:").strip()
            if line.startswith("data:") and payload != "[DONE]":
                last = json.loads(payload)
    assert last is not None and last["meta_info"]["finish_reason"], "no finished event"
    return last


def run_concurrently(
    work: Callable[[httpx.Client, int], dict[str, Any]], jobs: int, workers: int
) -> list[dict[str, Any]]:
    """Run `work(client, job)` for every job on `workers` threads; results in job order."""
    results: list[dict[str, Any] | None] = [None] * jobs
    queue = list(range(jobs))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if not queue or errors:
                        return
                    job = queue.pop(0)
                try:
                    results[job] = work(client, job)
                except BaseException as exc:  # surfaced in the caller's thread
                    with lock:
                        errors.append(exc)
                    return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


class Scraper:
    """Scrapes /metrics every `interval_s` on its own thread while load runs."""

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        self.url = url
        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Scraper:
        with httpx.Client(timeout=30) as client:
            self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._done.wait(self.interval_s):
                self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        with httpx.Client(timeout=30) as client:
            self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))


@dataclass(frozen=True)
class Served:
    """One /generate request: when the client sent it and got the answer (wall clock), and the
    server's meta_info for it."""

    sent_s: float
    returned_s: float
    meta: dict[str, Any]

    def held(self, finish_offset_s: float = 0.0) -> tuple[float, float]:
        """The wall-clock span the scheduler held the request: its first forward pass to its
        finish. With --enable-metrics SGLang 0.5.23 returns both as real time in meta_info
        (forward_entry_time from the scheduler, request_finished_ts from the tokenizer); they
        come from per-request timestamps, not from /metrics, so they check the reader's
        integrals from outside. `finish_offset_s` puts the finish on the client's clock
        (finish_clock_offset)."""
        return (
            float(self.meta["forward_entry_time"]),
            float(self.meta["request_finished_ts"]) + finish_offset_s,
        )


def finish_clock_offset(served: Sequence[Served]) -> float:
    """Seconds to add to SGLang's request_finished_ts to put it on the client's wall clock.
    SGLang stamps with perf_counter() and turns that into wall time with a time() - perf_counter()
    difference: the scheduler retakes it for every request it receives, the tokenizer only when
    it starts (sglang/srt/observability/req_time_stats.py, 0.5.23: calibrate_time_diff). A wall
    clock slewed or stepped since the server started (NTP on a CI VM) moves the tokenizer's
    finish and not the scheduler's forward entry. One CI run (stop 21) read 0.27 requests held
    against 0.94 from the integrals and 0.998 clients in flight at 1 user: spans cut short by a
    tokenizer clock behind the scheduler's would read so, and stepping the host's clock 0.5 s
    forward after the server started put the finish 0.486 s behind the client's receipt. The
    median gap from the finish to the receipt measures that shift (plus the answer's
    milliseconds on the wire)."""
    return statistics.median(_finish_gaps(served))


def finish_offset_spread(served: Sequence[Served]) -> float:
    """How far `finish_clock_offset` may put one request's finish from where it was: the
    spread of the finish-to-receipt gaps (the answer's time on the wire varies, and more on a
    loaded host), which the one offset for every request cannot follow."""
    gaps = _finish_gaps(served)
    return max(gaps) - min(gaps)


def _finish_gaps(served: Sequence[Served]) -> list[float]:
    return [s.returned_s - float(s.meta["request_finished_ts"]) for s in served]


class GenerateLoop:
    """`users` closed-loop clients, each keeping one greedy /generate in flight: the next is
    sent as soon as the last returns. Lengths vary (24-56 tokens, EOS ignored) so users drift
    apart instead of finishing in lockstep. Leaving the block lets every request in flight
    finish, so `served` holds every request that overlapped any window taken inside it."""

    def __init__(self, url: str, users: int) -> None:
        self.url = url
        self.users = users
        self.served: list[Served] = []
        self.errors: list[BaseException] = []
        self._per_user = [0] * users
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(u,)) for u in range(users)]

    def _run(self, user: int) -> None:
        with httpx.Client(timeout=600) as client:
            while not self._stop.is_set():
                sent = self._per_user[user]
                body = {
                    "text": PROMPTS[(user + sent) % len(PROMPTS)],
                    "sampling_params": {
                        "max_new_tokens": 24 + (user * 7 + sent * 13) % 33,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    },
                }
                started = time.time()
                try:
                    response = client.post(f"{self.url}/generate", json=body)
                    response.raise_for_status()
                except BaseException as exc:  # surfaced by wait_for and on exit
                    with self._changed:
                        self.errors.append(exc)
                        self._changed.notify_all()
                    return
                returned = time.time()
                with self._changed:
                    self.served.append(Served(started, returned, response.json()["meta_info"]))
                    self._per_user[user] += 1
                    self._changed.notify_all()

    def finished(self) -> int:
        with self._changed:
            return len(self.served)

    def wait_for(self, finished: int, each_user: int = 0, timeout_s: float = 900) -> None:
        """Until `finished` requests in all have returned, and `each_user` from every user.
        The timeout only stops a hung server; nothing here is timed."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self.served) < finished or min(self._per_user) < each_user:
                assert not self.errors, self.errors[0]
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.served)} of {finished} requests after {timeout_s}s"
                self._changed.wait(min(left, 5.0))

    def __enter__(self) -> GenerateLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        assert not self.errors, self.errors[0]


def mean_in_window(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The time integral of how many spans are open, over [start, end], divided by its length:
    each span counts only its part inside the window (no edge rounding)."""
    inside = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return inside / (end - start)


def largest_overlap(spans: Sequence[tuple[float, float]]) -> float:
    """The longest time a span (by start) runs past the start of the next one (0 when none
    does)."""
    ordered = sorted(spans)
    return max([0.0, *(end - start for (_, end), (start, _) in itertools.pairwise(ordered))])


def peak_open(spans: Sequence[tuple[float, float]]) -> int:
    """The most spans open at one instant."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    open_now = peak = 0
    for _, step in events:  # at equal times an end (-1) sorts first: touching is not overlap
        open_now += step
        peak = max(peak, open_now)
    return peak


def series_sum(snapshot: Snapshot, name: str) -> float:
    return float(sum(snapshot.series(name).values()))


def gauge_values(snapshots: Sequence[Snapshot], name: str) -> list[float]:
    return [series_sum(s, name) for s in snapshots if s.series(name)]
