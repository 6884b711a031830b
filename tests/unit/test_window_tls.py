"""Every scrape window shares one TLS context (runtime/window.py `tls_context`): building one
loads the CA bundle (tens of ms of CPU), which once per window was a quarter of a busy
operator's CPU in bench/operator_load.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from specpilot.runtime import window
from specpilot.runtime.window import WindowReader


def test_windows_build_their_clients_on_one_shared_tls_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[Any] = []
    real = httpx.Client

    def client(**kwargs: Any) -> httpx.Client:
        built.append(kwargs.get("verify"))
        return real(**kwargs)

    monkeypatch.setattr(window.httpx, "Client", client)
    transport = httpx.MockTransport(lambda _: httpx.Response(200, text=""))
    reader = WindowReader(transport=transport, clock=lambda: 0.0, sleep=lambda _: None)
    for _ in range(3):
        reader.read("vllm", {"pod": "http://pod/metrics"}, 0.0)
    assert len(built) == 3
    assert all(verify is window.tls_context() for verify in built)
