"""Traffic traces: CSV files `t,rps,<task>,...` that drive benchmarks and the demo.

Contract: a row holds the time (seconds from start), the Poisson arrival rate until the next
row, and task-mix weights (any non-negative numbers, normalised per row); the last row marks
the end (its rate and mix are not used). `load_trace` rejects a malformed file (not UTF-8, a
bad header, a cell that is not a finite number: `inf` and `nan` included) with a one-line
`ConfigError` naming the file, the line, the column and what is allowed.
"""

from __future__ import annotations

import csv
import io
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpilot.tuner import TASKS, ConfigError


@dataclass(frozen=True, slots=True)
class TraceRow:
    t: float
    rps: float
    mix: tuple[tuple[str, float], ...]
    """(task, probability) pairs summing to 1."""


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    rows: tuple[TraceRow, ...]

    @property
    def duration_s(self) -> float:
        return self.rows[-1].t

    def row_at(self, t: float) -> TraceRow:
        index = bisect_right([r.t for r in self.rows], t) - 1
        return self.rows[max(0, min(index, len(self.rows) - 2))]

    def rate_at(self, t: float) -> float:
        return self.row_at(t).rps


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    return parse_trace(read_trace_text(path), path.stem, source=str(path))


def read_trace_text(path: Path) -> str:
    """A trace file's text; unreadable or not UTF-8 is a `ConfigError` naming the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError("trace", str(path), "a readable file", str(exc)) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = data[exc.start : exc.start + 4]
        raise ConfigError(f"{path} line {line} column {column}", bad, "UTF-8 text") from None
    return text.removeprefix("\ufeff")


def parse_trace(text: str, name: str = "trace", *, source: str = "trace") -> Trace:
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise ConfigError(f"{source} line 1", str(exc), "a CSV header") from None
    if header[:2] != ["t", "rps"] or len(header) < 3:
        raise ConfigError(f"{source} header", ",".join(header), "t,rps,<task>[,<task>...]")
    tasks = header[2:]
    for task in tasks:
        if task not in TASKS:
            raise ConfigError(f"{source} header task", task, " | ".join(TASKS))
    rows: list[TraceRow] = []
    line = 1
    while (record := _next_record(reader, source, line + 1)) is not None:
        line = reader.line_num
        if not record or all(not cell.strip() for cell in record):
            continue
        where = f"{source} line {line}"
        if len(record) != len(header):
            raise ConfigError(where, ",".join(record), f"{len(header)} columns")
        values = [
            _number(f"{where} column {column}", cell)
            for column, cell in zip(header, record, strict=True)
        ]
        t, rps, weights = values[0], values[1], values[2:]
        if rows and t <= rows[-1].t:
            raise ConfigError(f"{where} column t", t, f"a time after {rows[-1].t:g}")
        total = sum(weights)
        if total <= 0:
            raise ConfigError(where, ",".join(record), "some positive task weight")
        rows.append(
            TraceRow(t, rps, tuple((k, w / total) for k, w in zip(tasks, weights, strict=True)))
        )
    if len(rows) < 2:
        raise ConfigError(source, name, "at least two rows (the last one marks the end)")
    if rows[0].t != 0:
        raise ConfigError(f"{source} line 2 column t", rows[0].t, "0 (traces start at zero)")
    return Trace(name, tuple(rows))


def _next_record(reader: Any, source: str, line: int) -> list[str] | None:
    try:
        record: list[str] = next(reader)
    except StopIteration:
        return None
    except csv.Error as exc:
        raise ConfigError(f"{source} line {line}", str(exc), "a CSV record") from None
    return record


def _number(where: str, cell: str) -> float:
    """A cell as a finite, non-negative number (times, rates and weights all are)."""
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(where, cell.strip(), "a finite number >= 0")
    return value
