"""The emulator's HTTP API under hostile clients, against a real `specpilot emulate` process:
fuzzed request bodies get a 4xx with a message (never a 5xx, never a traceback in its log), a
client that goes away stops its generation and frees its KV cache, and `--port 0` binds a port
the system chose, printed where a caller can read it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpilot.runtime.scrape import fetch_snapshot

SPECPILOT = str(Path(sys.executable).parent / "specpilot")
CONTEXT = 2048
"""--max-model-len the fuzzed emulator serves: max_tokens past it is refused."""


@dataclass
class Emulator:
    url: str
    log: list[str] = field(default_factory=list)


def start(*args: str) -> Iterator[Emulator]:
    command = [SPECPILOT, "emulate", "--engine", "vllm", "--gpu", "B200", "--load-delay", "0"]
    command += ["--model", "/models/llama", "--served-model-name", "llama"]
    command += ["--host", "127.0.0.1", "--port", "0", *args]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "the emulator printed nothing in 60 s"
        banner = process.stdout.readline().decode()
        assert "serving llama on http://127.0.0.1:" in banner, banner
        port = int(banner.rsplit(":", 1)[1])
        assert port not in (0, 8000)
        emulator = Emulator(url=f"http://127.0.0.1:{port}", log=[banner])
        drain = threading.Thread(
            target=lambda: emulator.log.extend(line.decode() for line in process.stdout or []),
            daemon=True,
        )
        drain.start()
        yield emulator
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    assert not any("Traceback" in line or "Error handling" in line for line in emulator.log), (
        "".join(emulator.log)
    )


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    yield from start("--max-model-len", str(CONTEXT))


def load(url: str) -> tuple[float, float]:
    """The emulator's running requests and KV cache usage, as its /metrics says."""
    with httpx.Client(timeout=10) as client:
        snapshot = fetch_snapshot(client, f"{url}/metrics", 0.0)
    running = sum(snapshot.series("vllm:num_requests_running").values())
    usage = sum(snapshot.series("vllm:kv_cache_usage_perc").values())
    return running, usage


def wait_idle(url: str, seconds: float = 30.0) -> tuple[float, float]:
    """Poll until nothing runs (a wide margin: an abort takes one step, milliseconds)."""
    deadline = time.monotonic() + seconds
    while True:
        running, usage = load(url)
        if (running == 0 and usage == 0) or time.monotonic() > deadline:
            return running, usage
        time.sleep(0.1)


# ------------------------------------------------------------------------------ fuzzing

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# valid max_tokens are kept small so a request that is served is served quickly
MAX_TOKENS = st.integers(-3, 24) | st.integers(CONTEXT, 10**30) | JSON
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "robot"]) | JSON,
        "content": st.text(max_size=20)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url"]) | JSON, "text": JSON}
            ),
            max_size=2,
        )
        | JSON,
    },
)
BODY = st.fixed_dictionaries(
    {"max_tokens": MAX_TOKENS},
    optional={
        "model": st.sampled_from(["llama", "gpt"]) | JSON,
        "prompt": st.text(max_size=30)
        | st.lists(st.text(max_size=5), max_size=3)
        | st.lists(st.integers(-2, 50), max_size=4)
        | JSON,
        "messages": st.lists(MESSAGE, max_size=3) | JSON,
        "stream": st.booleans() | JSON,
        "task": st.sampled_from(["chat", "code", "poetry"]) | JSON,
        "max_completion_tokens": MAX_TOKENS,
    },
)
RAW = (
    BODY.map(lambda body: json.dumps(body).encode())
    | JSON.map(lambda value: json.dumps(value).encode())
    | st.binary(max_size=40)
    | st.text(max_size=40).map(lambda text: text.encode("utf-16"))
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=RAW, chat=st.booleans())
def test_fuzzed_bodies_get_a_4xx_with_a_message_never_a_5xx(
    emulator: Emulator, raw: bytes, chat: bool
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    response = httpx.post(f"{emulator.url}{path}", content=raw, timeout=30)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] == response.status_code and error["message"].strip()
    else:
        assert response.status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
        ({"messages": [["user", "hi"]]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "task": ["chat"]}, "task"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, "context"),
    ],
)
def test_malformed_chat_requests_name_the_field(
    emulator: Emulator, body: dict[str, object], field: str
) -> None:
    response = httpx.post(f"{emulator.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]


def test_non_utf8_bodies_unknown_paths_and_huge_bodies_are_4xx_json(emulator: Emulator) -> None:
    latin1 = '{"prompt": "café", "max_tokens": 2}'.encode("latin-1")
    response = httpx.post(f"{emulator.url}/v1/completions", content=latin1, timeout=30)
    assert response.status_code == 400 and "UTF-8" in response.json()["error"]["message"]
    missing = httpx.get(f"{emulator.url}/v2/nothing", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    huge = b'{"prompt": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    too_large = httpx.post(f"{emulator.url}/v1/completions", content=huge, timeout=30)
    assert too_large.status_code == 413 and too_large.json()["error"]["message"]


# ------------------------------------------------------------------------------ disconnects

LONG = 100_000
"""max_tokens of a request that would run for minutes: the test gives up on it first."""


@pytest.fixture(scope="module")
def roomy() -> Iterator[Emulator]:
    """An emulator whose context is its whole KV cache, room for a request of LONG tokens."""
    yield from start()


def test_a_streaming_client_that_goes_away_frees_its_request(roomy: Emulator) -> None:
    emulator = roomy
    assert wait_idle(emulator.url) == (0, 0)
    body = {"model": "llama", "prompt": "hello", "max_tokens": LONG, "stream": True}
    with httpx.stream("POST", f"{emulator.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        running, usage = load(emulator.url)
        assert running == 1 and usage > 0  # it is generating
    # the connection is closed here, thousands of tokens before the request would finish
    assert wait_idle(emulator.url) == (0, 0)


def test_a_non_streaming_client_that_gives_up_frees_its_request(roomy: Emulator) -> None:
    emulator = roomy
    assert wait_idle(emulator.url) == (0, 0)
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = LONG
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{emulator.url}/v1/chat/completions", json=body, timeout=1.0)
    assert wait_idle(emulator.url) == (0, 0)
    # the server still serves the next request
    short = {**body, "max_tokens": 4}
    answer = httpx.post(f"{emulator.url}/v1/chat/completions", json=short, timeout=30)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    path=st.sampled_from(PATHS) | st.text(max_size=12).map(lambda t: "/" + t),
    query=st.dictionaries(st.text(max_size=6), st.text(max_size=12), max_size=2),
    content_type=st.sampled_from(["application/json", "text/plain", "", "multipart/form-data"]),
    raw=RAW,
)
def test_any_method_path_and_query_gets_an_answer_never_a_5xx(
    emulator: Emulator,
    method: str,
    path: str,
    query: dict[str, str],
    content_type: str,
    raw: bytes,
) -> None:
    """Wrong methods, unknown or odd paths (spaces, `..`, `%`), query strings and content
    types: a 4xx with a JSON message, or the route's answer; never a 5xx."""
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        request = httpx.Request(
            method, f"{emulator.url}{path}", params=query, content=raw, headers=headers
        )
    except (httpx.InvalidURL, UnicodeEncodeError):
        return  # the client refuses to send it: nothing reaches the server
    with httpx.Client(timeout=30) as client:
        response = client.send(request)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] == response.status_code and error["message"].strip()


@pytest.mark.parametrize(
    "text",
    [
        "$(touch /tmp/pwned); `id`",
        "line\nbreak\r\n",
        "x" * 10_240,
        "ünïcødé ✓ 模型",
        "\x00\x1b[31m",
    ],
)
def test_hostile_text_in_model_prompt_and_messages_is_served_or_refused_by_name(
    emulator: Emulator, text: str
) -> None:
    """A prompt or message holding shell metacharacters, control characters or 10 kB is
    served like any text; a model name the emulator does not serve is a 404 naming it."""
    prompt = {"model": "llama", "prompt": text, "max_tokens": 2}
    served = httpx.post(f"{emulator.url}/v1/completions", json=prompt, timeout=30)
    assert served.status_code == 200, served.text
    chat = {"model": "llama", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    served = httpx.post(f"{emulator.url}/v1/chat/completions", json=chat, timeout=30)
    assert served.status_code == 200, served.text
    unknown = httpx.post(
        f"{emulator.url}/v1/completions", json={**prompt, "model": text}, timeout=30
    )
    assert 400 <= unknown.status_code < 500, unknown.text
    assert unknown.json()["error"]["message"].strip()
