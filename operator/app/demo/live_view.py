"""The demo's live terminal view: plain ANSI, no curses.

Contract: `LiveView.update(frame)` shows one `Frame` (what the loop knows now). On a terminal it
redraws a fixed block in place (cursor up, clear to the end of the screen) with lines cut to the
terminal's width so wrapping cannot break the redraw; elsewhere (a pipe, a CI log) it prints one
compact line per tick and ignores in-between refreshes (`tick=False`). `close()` leaves the last
block on screen.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from dataclasses import dataclass
from typing import TextIO

BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
REGIME_COLOURS = {"memory-bound": "\x1b[32m", "transition": "\x1b[33m", "compute-bound": "\x1b[31m"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    elapsed_s: float
    duration_s: float
    phase: str
    offered_rps: float
    config: str
    regime: str
    acceptance_length: float | None
    batch: float | None
    waiting: float | None
    tokens_per_s: float | None
    last_action: str
    last_reason: str
    restarts: int
    ticks: int
    in_flight: int
    completed: int
    resent: int
    switching: bool = False


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class LiveView:
    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self._stream = stream or sys.stdout
        self._tty = self._stream.isatty() if tty is None else tty
        self._drawn = 0

    @property
    def tty(self) -> bool:
        return self._tty

    def update(self, frame: Frame, *, tick: bool = True) -> None:
        if self._tty:
            width = shutil.get_terminal_size((120, 24)).columns
            self._redraw(self.block(frame, width), width)
        elif tick:
            print(self.line(frame), file=self._stream, flush=True)

    def message(self, text: str) -> None:
        """A line above the live block (or in the log)."""
        if self._tty and self._drawn:
            self._stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0
        print(text, file=self._stream, flush=True)

    def close(self) -> None:
        self._drawn = 0

    def line(self, frame: Frame) -> str:
        return (
            f"t={frame.elapsed_s:5.1f}s [{frame.phase}] {frame.config} | {frame.regime} | "
            f"batch {_num(frame.batch)} | accept {_num(frame.acceptance_length, 2)} | "
            f"{_num(frame.tokens_per_s, 0)} tok/s | restarts {frame.restarts} | "
            f"{frame.last_action}: {frame.last_reason}"
        )

    def block(self, frame: Frame, width: int = 120) -> list[str]:
        done = min(1.0, frame.elapsed_s / frame.duration_s) if frame.duration_s else 1.0
        bar = "#" * round(30 * done) + "." * (30 - round(30 * done))
        colour = REGIME_COLOURS.get(frame.regime, "")
        state = " (switching...)" if frame.switching else ""
        return [
            f"{BOLD}SpecPilot demo{RESET}  H100 x Llama-3.1-8B (emulated, vLLM dialect, real time)",
            f"trace  [{bar}] {frame.elapsed_s:5.1f}/{frame.duration_s:.0f}s  phase: "
            f"{frame.phase}  offered {frame.offered_rps:g} req/s",
            f"config {BOLD}{frame.config}{RESET}{state}   regime {colour}{frame.regime}{RESET}",
            f"batch  {_num(frame.batch)} running, {_num(frame.waiting)} waiting   "
            f"acceptance length {_num(frame.acceptance_length, 2)}   "
            f"{BOLD}{_num(frame.tokens_per_s, 0)} tok/s{RESET}",
            f"load   {frame.in_flight} in flight, {frame.completed} completed, "
            f"{frame.resent} resent after restarts   ticks {frame.ticks}   "
            f"restarts {frame.restarts}",
            f"last   {frame.last_action}:",
            # The reason is the point of the view: wrapped, not cut.
            *(
                f"       {DIM}{part}{RESET}"
                for part in textwrap.wrap(frame.last_reason, max(20, width - 8))[:4]
            ),
        ]

    def _redraw(self, lines: list[str], width: int) -> None:
        out = []
        if self._drawn:
            out.append(f"\x1b[{self._drawn}F\x1b[J")
        out.extend(_clip(line, width) + "\n" for line in lines)
        self._stream.write("".join(out))
        self._stream.flush()
        self._drawn = len(lines)


def _clip(line: str, width: int) -> str:
    """Cut to `width` visible characters, keeping ANSI sequences intact."""
    visible, out, i = 0, [], 0
    while i < len(line):
        if line[i] == "\x1b":
            end = line.find("m", i)
            if end < 0:
                break
            out.append(line[i : end + 1])
            i = end + 1
            continue
        if visible >= width - 1:
            break
        out.append(line[i])
        visible += 1
        i += 1
    return "".join(out) + RESET
