"""The emulator's OpenAI request bodies: raw bytes -> a validated `GenerateRequest`, or a 4xx.

Contract: `parse_generate(raw, chat=..., limits=...)` reads a /v1/completions or
/v1/chat/completions body and returns what the engine needs (task, prompt tokens, max tokens,
streaming) or raises `BadRequest` with a 4xx status and a message naming the field, the value
and what is allowed. No body, however malformed (not UTF-8, not JSON, nested past the parser's
depth, wrong types, a prompt and max_tokens beyond the context), gets past this module as
anything but a `BadRequest`: the server answers 4xx, never 500.

As in vLLM's OpenAI server, `prompt + max_tokens` may not exceed the context (vLLM's
`--max-model-len`, SGLang's `--context-length`; without one, the tokens the KV cache holds):
a request that can never fit is refused instead of growing the KV cache without end.
Prompt tokens are counted as whitespace-separated words (the emulator has no tokenizer), token
id prompts by their length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specpilot.tuner import TASKS

ROLES = ("system", "user", "assistant", "tool", "developer")
CHAT_OVERHEAD_TOKENS = 4
"""Tokens a chat template adds around each message (role markers); counted per message."""


class BadRequest(Exception):
    """A request the server refuses with `status` (4xx) and `message`."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What the serving engine accepts."""

    model_name: str
    default_task: str
    context_tokens: int
    """Prompt plus max_tokens may not exceed this."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    task: str
    prompt_tokens: int
    max_tokens: int
    streaming: bool


def parse_generate(raw: bytes, *, chat: bool, limits: Limits) -> GenerateRequest:
    body = _json_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model={_show(model)} is invalid: allowed a string")
    if model is not None and model != limits.model_name:
        raise BadRequest(
            f"model {model!r} does not exist; served: {limits.model_name!r}", status=404
        )
    task = body.get("task", limits.default_task)
    if not isinstance(task, str) or task not in TASKS:
        raise BadRequest(f"task={_show(task)} is invalid: allowed {' | '.join(TASKS)}")
    streaming = body.get("stream")
    if streaming is not None and not isinstance(streaming, bool):
        raise BadRequest(f"stream={_show(streaming)} is invalid: allowed true | false")
    prompt_tokens = _chat_tokens(body) if chat else _prompt_tokens(body)
    max_tokens = _max_tokens(body, chat)
    if prompt_tokens + max_tokens > limits.context_tokens:
        room = limits.context_tokens - prompt_tokens
        fix = f"max_tokens at most {room}" if room >= 1 else "a shorter prompt"
        raise BadRequest(
            f"this model's maximum context length is {limits.context_tokens} tokens; the request "
            f"asked for {prompt_tokens} prompt + {max_tokens} max_tokens = "
            f"{prompt_tokens + max_tokens}: allowed {fix}"
        )
    return GenerateRequest(
        task=task, prompt_tokens=prompt_tokens, max_tokens=max_tokens, streaming=bool(streaming)
    )


def _json_object(raw: bytes) -> Mapping[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8 text (byte {exc.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise BadRequest("request body is not JSON this server reads: nested too deep") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, not {_kind(body)}")
    return body


def _max_tokens(body: Mapping[str, Any], chat: bool) -> int:
    field = "max_tokens"
    value = body.get("max_tokens")
    if value is None and chat:
        field, value = "max_completion_tokens", body.get("max_completion_tokens")
    if value is None:
        return 256 if chat else 16
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{field}={_show(value)} is invalid: allowed an integer >= 1")
    return value


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    prompt = body.get("prompt")
    allowed = "a string, a list of strings, a list of token ids or a list of such lists"
    if isinstance(prompt, str):
        return _words(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(_words(p) for p in prompt)
        if _token_ids(prompt):
            return len(prompt)
        if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
            return sum(len(p) for p in prompt)
    raise BadRequest(f"prompt={_show(prompt)} is invalid: allowed {allowed}")


def _token_ids(values: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _chat_tokens(body: Mapping[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(
            f"messages={_show(messages)} is invalid: allowed a non-empty list of "
            '{"role": ..., "content": ...} objects'
        )
    total = 0
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}={_show(message)} is invalid: allowed an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"{where}.role={_show(role)} is invalid: allowed {' | '.join(ROLES)}")
        total += _content_tokens(message.get("content"), f"{where}.content")
        total += CHAT_OVERHEAD_TOKENS
    return total


def _content_tokens(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _words(content)
    if isinstance(content, list):
        total = 0
        for index, part in enumerate(content):
            at = f"{where}[{index}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadRequest(
                    f"{at}={_show(part)} is invalid: allowed a "
                    '{"type": "text", "text": ...} part (this model reads text only)'
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"{at}.text={_show(text)} is invalid: allowed a string")
            total += _words(text)
        return total
    raise BadRequest(f"{where}={_show(content)} is invalid: allowed a string or a list of parts")


def _words(text: str) -> int:
    return len(text.split())


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _show(value: Any) -> str:
    """The offending value, short enough for one line."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
