"""Traffic traces: CSV files `t,rps,<task>,...` that drive benchmarks and the demo.

Contract: a row holds the time (seconds from start), the Poisson arrival rate until the next
row, and task-mix weights (any non-negative numbers, normalised per row); the last row marks
the end (its rate and mix are not used). `load_trace` rejects a malformed file with a message
naming the line, the column and what is allowed.
"""

from __future__ import annotations

import csv
import io
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("trace", str(path), "a readable CSV file", str(exc)) from exc
    return parse_trace(text, path.stem)


def parse_trace(text: str, name: str = "trace") -> Trace:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if header[:2] != ["t", "rps"] or len(header) < 3:
        raise ConfigError("trace header", ",".join(header), "t,rps,<task>[,<task>...]")
    tasks = header[2:]
    for task in tasks:
        if task not in TASKS:
            raise ConfigError("trace header task", task, " | ".join(TASKS))
    rows: list[TraceRow] = []
    for line, record in enumerate(reader, start=2):
        if not record or all(not cell.strip() for cell in record):
            continue
        if len(record) != len(header):
            raise ConfigError(f"trace line {line}", ",".join(record), f"{len(header)} columns")
        try:
            values = [float(cell) for cell in record]
        except ValueError as exc:
            raise ConfigError(f"trace line {line}", ",".join(record), "numbers") from exc
        t, rps, weights = values[0], values[1], values[2:]
        if rows and t <= rows[-1].t:
            raise ConfigError(f"trace line {line} column t", t, f"a time after {rows[-1].t}")
        if rps < 0 or any(w < 0 for w in weights):
            raise ConfigError(f"trace line {line}", ",".join(record), "non-negative rates/weights")
        total = sum(weights)
        if total <= 0:
            raise ConfigError(f"trace line {line}", ",".join(record), "some positive task weight")
        rows.append(
            TraceRow(t, rps, tuple((k, w / total) for k, w in zip(tasks, weights, strict=True)))
        )
    if len(rows) < 2:
        raise ConfigError("trace", name, "at least two rows (the last one marks the end)")
    if rows[0].t != 0:
        raise ConfigError("trace line 2 column t", rows[0].t, "0 (traces start at zero)")
    return Trace(name, tuple(rows))
