"""The demo's plot: one PNG of the real-time run.

Contract: `plot_run(path, ...)` writes a PNG with three panels sharing the time axis: tokens/s
per tick (the engine's generation rate, real time) over bands coloured by the running config,
with each switch marked, and the no-speculation static in fast mode per window for reference;
acceptance length and running batch per tick; the offered load from the trace over bands
coloured by the tuner's regime. matplotlib is imported lazily with the Agg backend (no display).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specpilot.operator.app.demo.actuator import Switch
from specpilot.runtime.traces import Trace
from specpilot.tuner import SpecConfig

REGIME_COLOURS = {
    "memory-bound": "#b7e4c7",
    "transition": "#ffe8a3",
    "compute-bound": "#f4a6a6",
    "unknown": "#e0e0e0",
}


def short_name(config: SpecConfig) -> str:
    """`eagle3 K=5 +schedule` rather than the whole per-batch table."""
    if config.schedule is None:
        return config.describe()
    return f"{config.method} K={config.max_k} +schedule"


def plot_run(
    path: Path,
    *,
    trace: Trace,
    ticks: Sequence[Mapping[str, Any]],
    switches: Sequence[Switch],
    reference: tuple[str, Sequence[float], float] | None = None,
) -> None:
    """`reference` is (label, tokens/s per window, window seconds) from fast mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    duration = trace.duration_s
    fig, (top, middle, bottom) = plt.subplots(
        3, 1, figsize=(12, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1.5, 1.5]}
    )
    configs = sorted({short_name(s.config) for s in switches})
    palette = plt.get_cmap("tab10")
    colour = {name: palette(i % 10) for i, name in enumerate(configs)}
    for i, switch in enumerate(switches):
        end = switches[i + 1].started_s if i + 1 < len(switches) else duration
        name = short_name(switch.config)
        top.axvspan(switch.started_s, end, color=colour[name], alpha=0.15, lw=0)
        if i:
            top.axvline(switch.started_s, color="black", lw=1, ls="--")
            top.annotate(
                name,
                (switch.started_s, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="bottom",
                ha="right",
                fontsize=7,
            )
    handles = [Rectangle((0, 0), 1, 1, color=colour[n], alpha=0.3, label=n) for n in configs]
    times = [t["t"] for t in ticks]
    (line,) = top.plot(
        times,
        [t["tokens_per_s"] or 0 for t in ticks],
        "o-",
        color="black",
        ms=3,
        label="SpecPilot, real time (engine tok/s per tick)",
    )
    handles.insert(0, line)
    if reference is not None:
        label, per_window, window = reference
        (ref,) = top.step(
            [window * (i + 1) for i in range(len(per_window))],
            per_window,
            where="pre",
            color="grey",
            ls=":",
            label=f"{label}, fast mode (SLO-goodput per window)",
        )
        handles.insert(1, ref)
    top.set_ylabel("tokens/s")
    top.legend(handles=handles, fontsize=7, loc="upper left", framealpha=0.8)
    top.set_title("SpecPilot demo: H100 x Llama-3.1-8B (emulated vLLM), compressed day")

    nan = float("nan")
    acceptance = [t["acceptance_length"] or nan for t in ticks]
    middle.plot(times, acceptance, "s-", ms=3, label="acceptance")
    middle.set_ylabel("acceptance length")
    middle.set_ylim(0.9, max([a for a in acceptance if a == a] + [2.0]) + 0.3)
    twin = middle.twinx()
    twin.plot(
        times, [t["batch"] or nan for t in ticks], "^-", ms=3, color="tab:purple", label="batch"
    )
    twin.set_ylabel("running batch", color="tab:purple")

    for i, tick in enumerate(ticks):
        start = ticks[i - 1]["t"] if i else 0.0
        regime = str(tick["regime"])
        bottom.axvspan(start, tick["t"], color=REGIME_COLOURS.get(regime, "#e0e0e0"), lw=0)
    rows = trace.rows
    bottom.step([r.t for r in rows], [r.rps for r in rows], where="post", color="black")
    bottom.set_ylabel("offered req/s")
    bottom.set_xlabel("trace time (s)")
    bottom.legend(
        handles=[Rectangle((0, 0), 1, 1, color=c, label=r) for r, c in REGIME_COLOURS.items()],
        fontsize=7,
        loc="upper right",
        title="regime (tuner)",
        title_fontsize=7,
    )
    bottom.set_xlim(0, duration)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
