"""What observing costs a CPU server: tokens/s of one real vLLM server with and without a
scraper GETting its /metrics, as `LocalEngine.observe` does inside each window.

Contract: one run starts one real vLLM no-speculation server (bench/real_vllm.py's
`make_engine`, the same launch the real-vLLM bench uses), warms it up, then per concurrency runs
`--rounds` rounds of one slot per arm, the arms' order rotating each round so that the host's
drift lands on every arm alike. An arm is "quiet" (no scraper) or a scrape interval in seconds:
a thread GETs /metrics at that interval for the whole slot. The load is bench/real_engine.py's
closed-loop streamed /v1/completions at temperature 0 (fixed prompts, no seed). Each round's
ratio is the arm's tokens/s over the quiet slot's in the same round; the report keeps every
slot and the median ratio per arm.

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/scrape_cost.py   (~8 min on 2 cores; run it on a
quiet host: another job's load is exactly what it measures). Writes
bench/results/scrape_cost.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from specpilot.tuner import SpecConfig

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from real_engine import (  # noqa: E402
    RESULTS,
    Phase,
    TimedEngine,
    arm_rounds,
    probe_head,
    probe_markdown_head,
    slot,
    warm_up,
)
from real_vllm import make_engine  # noqa: E402

QUIET = "quiet"


class Scraper:
    """GETs a /metrics URL every `interval_s` seconds on its own thread until stopped."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url, self.interval_s = url, interval_s
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                try:
                    client.get(self.url).raise_for_status()
                    self.scrapes += 1
                except httpx.HTTPError:
                    pass  # counted as not scraped; the load's tokens still tell the cost
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15.0)


def loaded_slot(
    engine: TimedEngine, phase: Phase, seconds: float, interval_s: float | None
) -> dict[str, Any]:
    """One slot of load; with a scraper at `interval_s` when given. Tokens/s and scrapes."""
    if interval_s is None:
        (counts, wall), scrapes = slot(engine, phase, seconds), 0
    else:
        with Scraper(f"{engine.url}/metrics", interval_s) as scraper:
            counts, wall = slot(engine, phase, seconds)
        scrapes = scraper.scrapes
    return {
        "tokens": counts["tokens"],
        "wall_s": round(wall, 2),
        "tokens_per_s": round(counts["tokens"] / wall, 2),
        "scrapes": scrapes,
    }


def arm_name(interval_s: float | None) -> str:
    return QUIET if interval_s is None else f"every {interval_s:g} s"


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per scraping arm: its per-round ratio to the quiet slot and their median."""
    out: dict[str, dict[str, Any]] = {}
    for name in rounds[0]:
        if name == QUIET:
            continue
        ratios = [
            r[name]["tokens_per_s"] / r[QUIET]["tokens_per_s"]
            for r in rounds
            if r[QUIET]["tokens_per_s"] > 0
        ]
        out[name] = {
            "ratios_to_quiet": [round(x, 3) for x in ratios],
            "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
            "rounds_below_quiet": sum(x < 1.0 for x in ratios),
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        *probe_markdown_head(
            report, "What observing costs a CPU server (real vLLM, no speculation)"
        ),
        f"{report['rounds']} rounds of one {report['slot_seconds']:g} s slot per arm, order "
        "rotating; ratio = the arm's tokens/s over the quiet slot's in the same round.",
        "",
        "| concurrency | arm | tokens/s per round | ratio to quiet per round | median |",
        "|---|---|---|---|---|",
    ]
    for block in report["concurrencies"]:
        for arm in [QUIET, *block["summary"]]:
            speeds = ", ".join(f"{r[arm]['tokens_per_s']:.0f}" for r in block["rounds"])
            s = block["summary"].get(arm)
            ratios = ", ".join(f"{x:.3f}" for x in s["ratios_to_quiet"]) if s else "-"
            median = f"{s['median_ratio']:.3f}" if s else "-"
            lines.append(f"| {block['concurrency']} | {arm} | {speeds} | {ratios} | {median} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--slot-seconds", type=float, default=11.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument(
        "--intervals",
        type=float,
        nargs="+",
        default=[1.0, 10.0 / 3],
        help="scrape intervals to compare with no scraping (LocalEngine's 1 s; a third of the "
        "real-engine bench's 10 s window)",
    )
    parser.add_argument("--port", type=int, default=8390)
    parser.add_argument("--out", type=Path, default=RESULTS / "scrape_cost.json")
    ns = parser.parse_args()
    if ns.rounds < 1 or ns.slot_seconds < 2.0 or any(i <= 0 for i in ns.intervals):
        parser.error("--rounds must be >= 1, --slot-seconds >= 2 and every --intervals > 0")
    started = time.time()
    report: dict[str, Any] = {
        **probe_head("bench/scrape_cost.py", started, ns.rounds, ns.slot_seconds),
        "concurrencies": [],
    }
    arms: list[float | None] = [None, *ns.intervals]
    intervals = {arm_name(a): a for a in arms}
    engine = make_engine(ns.port, Path(tempfile.mkdtemp(prefix="scrape-cost-")))
    try:
        engine.apply(SpecConfig())
        warm_up(engine.url)
        arm_rounds(
            ns,
            report,
            started,
            lambda r: [arm_name(a) for a in arms[r % len(arms) :] + arms[: r % len(arms)]],
            lambda name, phase: loaded_slot(engine, phase, ns.slot_seconds, intervals[name]),
            summarize,
            markdown,
        )
    finally:
        engine.stop()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
