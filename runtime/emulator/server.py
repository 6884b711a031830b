"""Real-time mode: the emulated engine as an HTTP server that speaks like vLLM or SGLang.

Contract: `serve(argv)` takes the engine's own command line (parsed by the same adapter code
that renders it, plus SpecPilot's --engine/--gpu/--model-profile/--load-delay/--task/--seed/
--world-seed), waits the model-load delay (no port is open meanwhile, as with a real engine),
then serves /health, /v1/models, /v1/completions and /v1/chat/completions (streaming or not)
and /metrics in that engine's exact metric dialect. One engine loop steps the core and sleeps for
each step's emulated duration; tokens reach the waiting requests as they are emitted.

With `--require-local-weights` the emulator refuses to start, as vLLM and SGLang do, when the
target or draft model is a local path (absolute or ./-relative) with nothing there; without it
(the default) any name is accepted, since the emulator loads no weights. Tests use it to make a
config really fail at start: a candidate whose draft weights are missing.

`--world-seed S` serves the hidden world S (`specpilot.runtime.emulator.world`): its acceptance,
step times and start time (the load delay, nominal or given, times the world's start factor);
the default 0 is the nominal world, whose truth is the priors and the catalog.

Requests may carry `"task"` (chat | code | summarize | math | creative) to pick the
acceptance curve; otherwise the server's --task applies. Prompt tokens are counted as
whitespace-separated words; the text is filler: this engine has no model. Request bodies are
read by `openai_request.parse_generate`: a malformed one is a 4xx with a message naming the
field, never a 500, and every error (an unknown path, a body over aiohttp's size limit) is
answered as JSON in the OpenAI error shape. A client that goes away (a closed stream, a
non-streaming request given up) has its request aborted: it stops generating and its KV cache
is freed, as vLLM and SGLang abort a disconnected request.

`--port 0` binds an ephemeral port; the line printed once serving names the port bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from specpilot.runtime.emulator.core import DEFAULT_MAX_NUM_SEQS, EngineCore, Request
from specpilot.runtime.emulator.exposition import Exposition, exposition_for
from specpilot.runtime.emulator.openai_request import BadRequest, Limits, parse_generate
from specpilot.runtime.emulator.world import draw_world
from specpilot.runtime.engines import get_adapter
from specpilot.runtime.engines.base import FoundFlag, find_flags, parse_int_flag
from specpilot.tuner import TASKS, ConfigError, SpecConfig, StepCost

FILLER = "the model speculates and verifies tokens in one pass while the batch grows".split()
# Seconds a real engine takes to load weights and warm up, per profile parameter count; an
# assumption for the default (tests shorten it): 8B-class models start in about a minute.
LOAD_SECONDS_PER_BILLION_PARAMS = 7.5

_LAUNCH_FLAGS = {
    "--model": "model",
    "--model-path": "model",
    "--served-model-name": "served",
    "--host": "host",
    "--port": "port",
    "--max-num-seqs": "max_seqs",
    "--max-running-requests": "max_seqs",
    "--max-model-len": "context",
    "--context-length": "context",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorSettings:
    engine: str
    config: SpecConfig
    model_name: str
    host: str
    port: int
    max_num_seqs: int
    gpu: str
    model_profile: str
    load_delay_s: float
    default_task: str
    seed: int
    world_seed: int = 0
    """The hidden world served (0: nominal, truth = priors and catalog)."""
    context_tokens: int | None = None
    """--max-model-len / --context-length; None: what the KV cache holds."""


def build_parser() -> argparse.ArgumentParser:
    """SpecPilot's own flags; every other argument is the engine's command line."""
    own = argparse.ArgumentParser(
        prog="specpilot emulate",
        allow_abbrev=False,
        description="Serve an emulated vLLM or SGLang. Arguments not listed here are the "
        "engine's own (--model, --port 0 for any free port, --max-model-len, the speculative "
        "flags...).",
    )
    own.add_argument(
        "--engine",
        choices=["vllm", "sglang"],
        default="vllm",
        help="dialect (default: %(default)s)",
    )
    own.add_argument(
        "--gpu",
        default="H100",
        help="GPU class whose step times are emulated (default: %(default)s)",
    )
    own.add_argument(
        "--model-profile", default="llama-3.1-8b", help="model emulated (default: %(default)s)"
    )
    own.add_argument(
        "--load-delay",
        type=float,
        default=None,
        help="nominal seconds before serving (the world's start factor scales it; "
        "default: 7.5 s per billion parameters)",
    )
    own.add_argument(
        "--task",
        default="chat",
        choices=TASKS,
        help="acceptance of requests that name no task (default: %(default)s)",
    )
    own.add_argument("--seed", type=int, default=0, help="acceptance draws (default: %(default)s)")
    own.add_argument(
        "--world-seed",
        type=int,
        default=0,
        help="hidden world to serve (0: nominal, the priors) (default: %(default)s)",
    )
    own.add_argument(
        "--require-local-weights",
        action="store_true",
        help="refuse to start, as engines do, when a local model or draft path is missing",
    )
    return own


def parse_settings(argv: Sequence[str]) -> EmulatorSettings:
    """Split SpecPilot's own flags from the engine's command line and read both."""
    own = build_parser()
    ns, engine_args = own.parse_known_args(list(argv))
    config = get_adapter(ns.engine).parse(engine_args)
    found = find_flags(engine_args, _LAUNCH_FLAGS)
    model = found["model"].value if "model" in found else None
    flag = "--model" if ns.engine == "vllm" else "--model-path"
    if not model:
        raise ConfigError(flag, None, "the served model's path or name")
    if ns.require_local_weights:
        _require_weights(flag, model)
        _require_weights("draft_model", config.draft_model)
    served = found["served"].value if "served" in found else model
    perf = StepCost.for_hardware(ns.gpu, ns.model_profile)  # validates both names
    world = draw_world(ns.world_seed)  # validates the seed
    load_delay = ns.load_delay
    if load_delay is not None and not (math.isfinite(load_delay) and load_delay >= 0):
        raise ConfigError("--load-delay", load_delay, "a finite number of seconds, 0 or more")
    if load_delay is None:
        load_delay = LOAD_SECONDS_PER_BILLION_PARAMS * perf.profile.params / 1e9
    load_delay = world.start_time_s(load_delay)
    return EmulatorSettings(
        engine=ns.engine,
        config=config,
        model_name=served or model,
        host=(found["host"].value if "host" in found else None) or "0.0.0.0",
        port=_port(parse_int_flag(found.get("port")), ns.engine),
        max_num_seqs=_positive("max_seqs", found) or DEFAULT_MAX_NUM_SEQS,
        gpu=ns.gpu,
        model_profile=ns.model_profile,
        load_delay_s=load_delay,
        default_task=ns.task,
        seed=ns.seed,
        world_seed=ns.world_seed,
        context_tokens=_positive("context", found),
    )


def _port(port: int | None, engine: str) -> int:
    if port is None:
        return 8000 if engine == "vllm" else 30000
    if not 0 <= port <= 65535:
        raise ConfigError("--port", port, "0 (any free port) to 65535")
    return port


def _positive(name: str, found: dict[str, FoundFlag]) -> int | None:
    """A flag that must be a whole number >= 1, when given."""
    flag = found.get(name)
    value = parse_int_flag(flag)
    if flag is not None and value is not None and value < 1:
        raise ConfigError(flag.name, value, "an integer >= 1")
    return value


def _require_weights(field: str, path: str | None) -> None:
    if path is None or not path.startswith(("/", "./", "../")):
        return  # a hub repo id: a real engine would download it
    if not Path(path).exists():
        raise ConfigError(field, path, "a local directory that exists", "no weights there")


@dataclass(eq=False)
class _Pending:
    request: Request
    streaming: bool
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)


MAX_LAG_S = 0.5
"""How far emulated time may trail the wall clock before it gives up catching up."""


class EmulatedEngine:
    """Steps the core in real time and hands emitted tokens to waiting HTTP handlers."""

    def __init__(self, settings: EmulatorSettings) -> None:
        self.settings = settings
        world = draw_world(settings.world_seed)
        self.core = EngineCore(
            config=settings.config,
            performance=world.step_cost(settings.gpu, settings.model_profile),
            max_num_seqs=settings.max_num_seqs,
            seed=settings.seed,
            acceptance=world.acceptance_curve,
        )
        self.exposition: Exposition = exposition_for(
            settings.engine, settings.model_name, settings.config.max_k
        )
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)
        self._clock_origin = time.monotonic()
        kv = self.core.kv_capacity_tokens
        self.limits = Limits(
            model_name=settings.model_name,
            default_task=settings.default_task,
            context_tokens=min(settings.context_tokens or kv, kv),
        )

    def now(self) -> float:
        return time.monotonic() - self._clock_origin

    def submit(self, task: str, prompt_tokens: int, max_tokens: int, streaming: bool) -> _Pending:
        request = Request(
            request_id=f"req-{next(self._ids)}",
            task=task,
            prompt_tokens=max(prompt_tokens, 1),
            max_tokens=max(max_tokens, 1),
            arrival_s=self.now(),
        )
        pending = _Pending(request, streaming)
        self._pending[request.request_id] = pending
        self.core.add_request(request)
        self._wake.set()
        return pending

    def abort(self, pending: _Pending) -> None:
        """Stop generating for a request whose client has gone; a finished one is left be."""
        if self._pending.pop(pending.request.request_id, None) is None:
            return
        if self.core.abort(pending.request):
            self.exposition.record_aborted(pending.request, self.core)

    @property
    def in_flight(self) -> int:
        """Requests submitted and neither finished nor aborted."""
        return len(self._pending)

    async def run(self) -> None:
        cursor: float | None = None
        while True:
            now = self.now()
            # Steps run back to back in emulated time: a late wakeup of the event loop (a busy
            # host) is caught up on the next steps instead of lost, unless the loop fell more
            # than MAX_LAG_S behind; then emulated time jumps to the real clock.
            start = now
            if cursor is not None and now - cursor <= MAX_LAG_S:
                start = cursor
            outcome = self.core.step(start)
            if outcome is None:
                cursor = None
                self._wake.clear()
                await self._wake.wait()
                continue
            cursor = outcome.start_s + outcome.duration_s
            await asyncio.sleep(max(0.0, cursor - self.now()))
            self.exposition.record_step(outcome, self.core)
            for request_id, tokens in outcome.emitted.items():
                pending = self._pending.get(request_id)
                if pending is not None:
                    pending.tokens.put_nowait(tokens)
            for request in outcome.finished:
                pending = self._pending.pop(request.request_id, None)
                self.exposition.record_finished(request, pending.streaming if pending else False)
                if pending is not None:
                    pending.tokens.put_nowait(None)


def _words(count: int, offset: int) -> str:
    return " ".join(FILLER[(offset + i) % len(FILLER)] for i in range(count))


def build_app(engine: EmulatedEngine) -> web.Application:
    settings = engine.settings

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        entry = {"id": settings.model_name, "object": "model", "owned_by": "specpilot-emulator"}
        return web.json_response({"object": "list", "data": [entry]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=engine.exposition.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def generate(http: web.Request, chat: bool) -> web.StreamResponse:
        try:
            asked = parse_generate(await http.read(), chat=chat, limits=engine.limits)
        except BadRequest as exc:
            return _error(exc.status, exc.message)
        prompt_tokens = asked.prompt_tokens
        pending = engine.submit(asked.task, prompt_tokens, asked.max_tokens, asked.streaming)
        # The server cancels this handler when its client disconnects (handler_cancellation):
        # the request is then aborted, whichever await it was cancelled in.
        try:
            return await _answer(http, pending, chat, prompt_tokens)
        finally:
            engine.abort(pending)

    async def _answer(
        http: web.Request, pending: _Pending, chat: bool, prompt_tokens: int
    ) -> web.StreamResponse:
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        request_id = ("chatcmpl-" if chat else "cmpl-") + pending.request.request_id
        if pending.streaming:
            return await _stream(http, pending, chat, request_id, created, settings.model_name)
        produced = 0
        while (tokens := await pending.tokens.get()) is not None:
            produced += tokens
        text = _words(produced, 0)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": produced,
            "total_tokens": prompt_tokens + produced,
        }
        return web.json_response(
            {
                "id": request_id,
                "object": kind,
                "created": created,
                "model": settings.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def completions(http: web.Request) -> web.StreamResponse:
        return await generate(http, chat=False)

    async def chat_completions(http: web.Request) -> web.StreamResponse:
        return await generate(http, chat=True)

    app = web.Application(middlewares=[_json_errors])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


async def _stream(
    http: web.Request, pending: _Pending, chat: bool, request_id: str, created: int, model: str
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    # a client gone mid-stream ends the writing; the caller aborts the request
    with contextlib.suppress(ConnectionResetError):
        await _write_stream(http, response, pending, chat, request_id, created, model)
    return response


async def _write_stream(
    http: web.Request,
    response: web.StreamResponse,
    pending: _Pending,
    chat: bool,
    request_id: str,
    created: int,
    model: str,
) -> None:
    await response.prepare(http)
    kind = "chat.completion.chunk" if chat else "text_completion"
    produced = 0
    while (tokens := await pending.tokens.get()) is not None:
        text = (" " if produced else "") + _words(tokens, produced)
        produced += tokens
        delta: dict[str, Any] = {"index": 0, "finish_reason": None}
        if chat:
            delta["delta"] = {"content": text}
        else:
            delta["text"] = text
        chunk = {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [delta],
        }
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    last: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    last["delta" if chat else "text"] = {} if chat else ""
    final = {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [last],
    }
    await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
    await response.write_eof()


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (unknown path, wrong method, body too large) in the same JSON
    error shape as the API's."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)


_ERROR_TYPES = {404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestTooLargeError"}


def _error(status: int, message: str) -> web.Response:
    kind = _ERROR_TYPES.get(status, "BadRequestError")
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status)


async def serve(settings: EmulatorSettings) -> None:
    await asyncio.sleep(settings.load_delay_s)  # a real engine opens no port while loading
    engine = EmulatedEngine(settings)
    runner = web.AppRunner(build_app(engine), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    port = bound_port(runner, settings.port)
    print(
        f"specpilot emulator ({settings.engine}, {settings.gpu} x {settings.model_profile}, "
        f"{settings.config.describe()}"
        f"{f', world {settings.world_seed}' if settings.world_seed else ''}) serving "
        f"{settings.model_name} on http://{settings.host}:{port}",
        flush=True,
    )
    try:
        await engine.run()
    finally:
        await runner.cleanup()


def bound_port(runner: web.AppRunner, asked: int) -> int:
    """The port the server listens on: the one asked for, or the one the system chose for 0."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked
