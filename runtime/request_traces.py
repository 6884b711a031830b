"""Per-request traces: every request's arrival, prompt length and output length, replayed as is.

Contract: `load_azure_trace` reads the Azure LLM inference trace format (CSV
`TIMESTAMP,ContextTokens,GeneratedTokens`; the timestamp is absolute, e.g.
`2023-11-16 18:15:46.6805900`, up to 9 fractional digits, an optional `Z`/`+HH:MM` offset) and
`load_mooncake_trace` Mooncake's JSONL (`timestamp` in ms, `input_length`, `output_length`; other
keys such as `hash_ids` are ignored). Both return a `RequestTrace` whose arrivals count from the
earliest request, sorted. `load_any_trace` picks the reader from the file's extension and first
line, and also returns the rate curves of `specpilot.runtime.traces`.

Neither format carries prompt text, so a request's task (which sets its acceptance) is not in
the trace: it is drawn from the task mix the caller gives (default: all chat), seeded, one draw
per request in arrival order, and the mix is kept on the trace so a report can say which it used.

A malformed file (not UTF-8, empty, a bad header, a bad number, a negative length, a timestamp
more than `backwards_tolerance_s` earlier than one before it) raises `ConfigError` whose one-line
message names the file, the line and the column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from specpilot.runtime.traces import Trace, parse_trace, read_trace_text
from specpilot.tuner import TASKS, ConfigError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
DEFAULT_MIX: tuple[tuple[str, float], ...] = (("chat", 1.0),)
BACKWARDS_TOLERANCE_S = 1.0
"""How far a timestamp may fall behind an earlier one (log jitter) before the file is rejected."""

_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    """Seconds from the trace's first request."""
    prompt_tokens: int
    output_tokens: int
    task: str
    """Drawn from the caller's task mix: the trace itself has no prompt text."""


@dataclass(frozen=True, slots=True)
class RequestTrace:
    name: str
    requests: tuple[TraceRequest, ...]
    """Sorted by arrival."""
    source: str
    """Where it came from: a file path, or "poisson"."""
    task_mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    """The (task, probability) mix the tasks were drawn from."""

    @property
    def duration_s(self) -> float:
        """The last arrival (seconds from the first)."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def mean_rps(self) -> float:
        return len(self.requests) / self.duration_s if self.duration_s > 0 else 0.0


def normalise_mix(mix: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    """(task, probability) pairs summing to 1; an unknown task or a bad weight is a ConfigError."""
    if mix is None:
        return DEFAULT_MIX
    for task, weight in mix.items():
        if task not in TASKS:
            raise ConfigError("task mix task", task, " | ".join(TASKS))
        if not math.isfinite(weight) or weight < 0:
            raise ConfigError(f"task mix weight of {task}", weight, "a non-negative number")
    total = sum(mix.values())
    if total <= 0:
        raise ConfigError("task mix", dict(mix), "some positive weight")
    return tuple((task, weight / total) for task, weight in mix.items() if weight > 0)


def parse_task_mix(spec: str) -> dict[str, float]:
    """`chat=3,code=1` -> {"chat": 3.0, "code": 1.0} (weights, normalised by `normalise_mix`)."""
    mix: dict[str, float] = {}
    for part in spec.split(","):
        task, sep, weight = part.partition("=")
        try:
            mix[task.strip()] = float(weight) if sep else math.nan
        except ValueError:
            mix[task.strip()] = math.nan
        if math.isnan(mix[task.strip()]):
            raise ConfigError(
                "--task-mix", spec, "task=weight[,task=weight...], e.g. chat=3,code=1"
            )
    normalise_mix(mix)
    return mix


def _draw_tasks(count: int, mix: tuple[tuple[str, float], ...], seed: int) -> list[str]:
    tasks, weights = zip(*mix, strict=True)
    return random.Random(seed).choices(tasks, weights, k=count)


def _bad(where: str, line: int, column: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{where} line {line} column {column}", value, allowed)


def _timestamp_ns(cell: str) -> int:
    """An absolute timestamp in ns since the epoch (no offset means UTC); ValueError if bad."""
    match = _TIMESTAMP.fullmatch(cell.strip())
    if match is None:
        raise ValueError(cell)
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, offset = match.group(7) or "", match.group(8)
    zone = UTC
    if offset and offset != "Z":
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        zone = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    whole = datetime(year, month, day, hour, minute, second, tzinfo=zone)
    seconds = (whole - _EPOCH) // timedelta(seconds=1)
    return seconds * 1_000_000_000 + int(fraction.ljust(9, "0"))


def _length(value: object) -> int:
    """A token count: a non-negative integer (or an integral JSON float); else ValueError."""
    if isinstance(value, str):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(value)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if value < 0:
        raise ValueError(value)
    return int(value)


def _finish(
    rows: list[tuple[int, int, int]],
    *,
    name: str,
    source: str,
    ticks_per_s: float,
    mix: Mapping[str, float] | None,
    seed: int,
    end_line: int,
) -> RequestTrace:
    """Rows of (time in ticks, prompt, output), in file order -> the trace, sorted, tasks drawn."""
    if not rows:
        raise _bad(source, end_line, "-", "no requests", "at least one request")
    pairs = normalise_mix(mix)
    rows = sorted(rows, key=lambda row: row[0])  # stable: ties keep file order
    first = rows[0][0]
    tasks = _draw_tasks(len(rows), pairs, seed)
    requests = tuple(
        TraceRequest((t - first) / ticks_per_s, prompt, output, task)
        for (t, prompt, output), task in zip(rows, tasks, strict=True)
    )
    return RequestTrace(name, requests, source, pairs)


@dataclass(slots=True)
class _Order:
    """The latest time seen so far, and its line: a later line may fall back `tolerance` s."""

    where: str
    column: str
    tolerance: float
    latest: float = -math.inf
    latest_line: int = 0

    def check(self, line: int, t: float, cell: object) -> None:
        if t < self.latest - self.tolerance:
            allowed = f"no more than {self.tolerance:g} s before line {self.latest_line}'s time"
            raise _bad(self.where, line, self.column, cell, allowed)
        if t > self.latest:
            self.latest, self.latest_line = t, line


def _next_record(reader: Any, source: str) -> list[str] | None:
    """The next CSV record, or None at the end; a record csv cannot read is a ConfigError."""
    try:
        record: list[str] = next(reader)
    except StopIteration:
        return None
    except csv.Error as exc:
        raise _bad(source, reader.line_num, "-", str(exc), "a CSV record") from None
    return record


def parse_azure_trace(
    text: str,
    name: str = "azure",
    *,
    source: str = "<text>",
    mix: Mapping[str, float] | None = None,
    seed: int = 0,
    backwards_tolerance_s: float = BACKWARDS_TOLERANCE_S,
) -> RequestTrace:
    reader = csv.reader(io.StringIO(text))
    header = [cell.strip() for cell in _next_record(reader, source) or []]
    if any(column not in header for column in AZURE_COLUMNS):
        raise _bad(source, 1, "header", ",".join(header), ",".join(AZURE_COLUMNS))
    at = {column: header.index(column) for column in AZURE_COLUMNS}
    rows: list[tuple[int, int, int]] = []
    order = _Order(source, "TIMESTAMP", backwards_tolerance_s)
    while (record := _next_record(reader, source)) is not None:
        line = reader.line_num
        if not record or all(not cell.strip() for cell in record):
            continue
        if len(record) != len(header):
            raise _bad(source, line, "-", ",".join(record), f"{len(header)} columns")
        try:
            t = _timestamp_ns(record[at["TIMESTAMP"]])
        except ValueError:
            allowed = "a time like 2023-11-16 18:15:46.6805900"
            raise _bad(source, line, "TIMESTAMP", record[at["TIMESTAMP"]], allowed) from None
        lengths = []
        for column in AZURE_COLUMNS[1:]:
            try:
                lengths.append(_length(record[at[column]]))
            except ValueError:
                allowed = "a non-negative integer"
                raise _bad(source, line, column, record[at[column]], allowed) from None
        order.check(line, t / 1e9, record[at["TIMESTAMP"]])
        rows.append((t, lengths[0], lengths[1]))
    end = reader.line_num + 1
    return _finish(
        rows, name=name, source=source, ticks_per_s=1e9, mix=mix, seed=seed, end_line=end
    )


def parse_mooncake_trace(
    text: str,
    name: str = "mooncake",
    *,
    source: str = "<text>",
    mix: Mapping[str, float] | None = None,
    seed: int = 0,
    backwards_tolerance_s: float = BACKWARDS_TOLERANCE_S,
) -> RequestTrace:
    rows: list[tuple[int, int, int]] = []
    order = _Order(source, "timestamp", backwards_tolerance_s)
    lines = text.splitlines()
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _bad(source, line, str(exc.colno), raw[:60], "a JSON object") from None
        if not isinstance(record, dict):
            raise _bad(source, line, "1", raw[:60], "a JSON object")
        values = []
        for key in MOONCAKE_KEYS:
            if key not in record:
                allowed = f"an object with {', '.join(MOONCAKE_KEYS)}"
                raise _bad(source, line, key, "missing", allowed)
            try:
                if key == "timestamp":
                    stamp = record[key]
                    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
                        raise ValueError(stamp)
                    if not math.isfinite(stamp):
                        raise ValueError(stamp)
                    values.append(round(stamp * 1000))  # ms -> us: exact for whole ms
                else:
                    values.append(_length(record[key]))
            except ValueError:
                allowed = "a number (ms)" if key == "timestamp" else "a non-negative integer"
                raise _bad(source, line, key, record[key], allowed) from None
        order.check(line, values[0] / 1e6, record["timestamp"])
        rows.append((values[0], values[1], values[2]))
    end = len(lines) + 1
    return _finish(
        rows, name=name, source=source, ticks_per_s=1e6, mix=mix, seed=seed, end_line=end
    )


def load_azure_trace(
    path: str | Path,
    *,
    mix: Mapping[str, float] | None = None,
    seed: int = 0,
    backwards_tolerance_s: float = BACKWARDS_TOLERANCE_S,
) -> RequestTrace:
    path = Path(path)
    return parse_azure_trace(
        read_trace_text(path),
        path.stem,
        source=str(path),
        mix=mix,
        seed=seed,
        backwards_tolerance_s=backwards_tolerance_s,
    )


def load_mooncake_trace(
    path: str | Path,
    *,
    mix: Mapping[str, float] | None = None,
    seed: int = 0,
    backwards_tolerance_s: float = BACKWARDS_TOLERANCE_S,
) -> RequestTrace:
    path = Path(path)
    return parse_mooncake_trace(
        read_trace_text(path),
        path.stem,
        source=str(path),
        mix=mix,
        seed=seed,
        backwards_tolerance_s=backwards_tolerance_s,
    )


def load_any_trace(
    path: str | Path, *, mix: Mapping[str, float] | None = None, seed: int = 0
) -> Trace | RequestTrace:
    """A rate curve (`t,rps,<task>...`), an Azure CSV or a Mooncake JSONL, told apart by the
    extension and the first non-blank line; `mix` and `seed` apply to per-request traces only."""
    path = Path(path)
    text = read_trace_text(path)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if path.suffix.lower() in (".jsonl", ".json") or first.startswith("{"):
        return parse_mooncake_trace(text, path.stem, source=str(path), mix=mix, seed=seed)
    header = [cell.strip() for cell in first.split(",")]
    if header[:2] == ["t", "rps"]:
        return parse_trace(text, path.stem, source=str(path))
    if "TIMESTAMP" in header:
        return parse_azure_trace(text, path.stem, source=str(path), mix=mix, seed=seed)
    allowed = (
        "a rate curve (t,rps,<task>...), an Azure trace (TIMESTAMP,ContextTokens,"
        "GeneratedTokens) or Mooncake JSONL (timestamp, input_length, output_length)"
    )
    raise _bad(str(path), 1, "header", first[:80], allowed)
