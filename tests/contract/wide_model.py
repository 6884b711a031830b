"""A wider random Llama for the running-batch contract tests, and closed-loop users.

The tiny model's steps (~1.5 ms on vLLM) are faster than an engine's HTTP front end can feed
requests on two shared cores: at 32 users vLLM itself holds about 3 of them (every engine-side
integral agrees), the others wait in the front end where no engine metric sees them. A random
4-layer, 1024-wide Llama (47M parameters, the tiny model's tokenizer; ~35 ms per vLLM step at
batch 32) makes the engine the bottleneck, so the client's concurrency is the engine's. It is
written in a few seconds from the tiny model's config with the engine's own torch and
transformers; nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import httpx

from conftest import MODELS, OFFLINE_ENV, VLLM_PYTHON, require

PROMPT = "the quick brown fox jumps over the lazy dog " * 4
WIDEN = """
import json, shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
source, target = Path(sys.argv[1]), Path(sys.argv[2])
fields = json.loads((source / "config.json").read_text())
fields.pop("architectures", None)
fields.pop("transformers_version", None)
fields.update(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, head_dim=64)
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(**fields)).to(torch.bfloat16).save_pretrained(target)
for path in source.iterdir():
    if path.name.startswith("tokenizer") or path.name == "chat_template.jinja":
        shutil.copy(path, target / path.name)
"""


def write_wide_model(target: Path) -> Path:
    subprocess.run(
        [str(require(VLLM_PYTHON)), "-c", WIDEN, str(require(MODELS / "llama")), str(target)],
        env=OFFLINE_ENV,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


class ClosedLoop:
    """`users` threads, each keeping one greedy completion in flight: the next is sent as soon
    as the last returns. Lengths vary (24-72 tokens) so users drift apart instead of finishing
    in lockstep."""

    def __init__(self, url: str, served: str, users: int) -> None:
        self.url = url
        self.served = served
        self.errors: list[str] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(user,), daemon=True) for user in range(users)
        ]

    def _run(self, user: int) -> None:
        sent = 0
        with httpx.Client(timeout=300) as client:
            while not self._stop.is_set():
                body = {
                    "model": self.served,
                    "prompt": PROMPT,
                    "max_tokens": 24 + (user * 7 + sent * 13) % 49,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                sent += 1
                try:
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                except httpx.RemoteProtocolError:
                    # a kept-alive connection the server closed as this request went out (a
                    # client starved past uvicorn's keep-alive under stress-ng): nothing was
                    # served, so the user sends again on a new connection, as browsers do
                    self.reconnects += 1
                except httpx.HTTPError as exc:
                    self.errors.append(str(exc))
                    return

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
