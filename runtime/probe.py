"""Measure the local device's step time with a transformer-shaped torch stack and fit it.

Contract: `run_probe(profile)` builds random-weight layers of the profile's shapes (RMSNorm,
GQA attention of a step's new tokens against a KV cache, SiLU-gated MLP), times one step over
a sweep of tokens-per-step x KV tokens (median of interleaved repeats), and fits
t = fixed + per_token x tokens + per_kv_token x kv_tokens by non-negative least squares on
relative error. Measured: the stack as built (`layers_measured` layers at `width_scale` of the
profile's width, in `dtype`). Extrapolated, by the multipliers in `factors`: the full-profile
coefficients, which take profile.layers / layers_measured (sound: the layers are identical and
a step is their sum); 1/width^2 for matmuls and weight reads and 1/width for attention per KV
token, only if the width was scaled down; and, on fixed and per-token time, the LM head in
proportion to its weights. Not covered: sampling, scheduling, CUDA graphs, and for MoE the
extra experts more tokens touch (the stack is the dense equivalent of the active path).
torch and numpy are imported lazily: importing this module needs neither.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from specpilot.tuner import ConfigError, ModelProfile, StepTimeModel

TOKEN_SWEEP: tuple[int, ...] = (1, 4, 16, 64, 256)
KV_SWEEP: tuple[int, ...] = (0, 2048, 8192)
_NAMES = ("fixed_s", "per_token_s", "per_kv_token_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    """MLP width one token computes (for MoE, the experts it routes to, as one dense MLP)."""

    @property
    def params(self) -> int:
        """Weights of one layer: q/k/v/o, gate/up/down, two norms."""
        attn = self.hidden * self.head_dim * 2 * (self.heads + self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def scaled(self, kv_heads: int) -> LayerShapes:
        """`kv_heads` KV heads, every width shrunk by the same factor: the GQA group, head_dim
        and MLP ratio stay the profile's, so cost moves predictably with the factor."""
        s = kv_heads / self.kv_heads
        heads = self.heads // self.kv_heads * kv_heads
        hidden, inter = max(1, round(self.hidden * s)), max(1, round(self.intermediate * s))
        return replace(self, heads=heads, kv_heads=kv_heads, hidden=hidden, intermediate=inter)


def active_layer_params(profile: ModelProfile) -> float:
    """Weights one token computes with in one layer: active weights less embedding and head."""
    return (profile.active_params - 2 * profile.lm_head_params) / profile.layers


def layer_shapes(profile: ModelProfile) -> LayerShapes:
    """The profile's layer; the MLP width is what makes a layer hold active_layer_params (it
    lands within 3% of the published widths: 14336, 28672, 12288, 8 x 768 experts)."""
    hidden, hd, kv = profile.hidden_size, profile.head_dim, profile.kv_heads
    heads = profile.attention_heads
    attn = hidden * hd * 2 * (heads + kv)
    inter = max(1, round((active_layer_params(profile) - attn) / (3 * hidden)))
    return LayerShapes(hidden=hidden, heads=heads, kv_heads=kv, head_dim=hd, intermediate=inter)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    fixed_s: float
    per_token_s: float
    per_kv_token_s: float
    rms_rel_error: float
    max_rel_error: float
    clamped: tuple[str, ...]
    """Coefficients the non-negativity constraint holds at zero."""


def fit_step_time(points: Sequence[tuple[int, int, float]]) -> Fit:
    """Non-negative least squares of t = a + b x tokens + c x kv on relative error (step times
    span decades; the small steps, where the fixed term lives, matter as much as the large).
    With three unknowns, the best non-negative unconstrained fit over every subset of them is
    the exact NNLS optimum."""
    import numpy as np

    data = np.asarray(points, dtype=float)
    t = data[:, 2]
    design = np.column_stack([np.ones_like(t), data[:, 0], data[:, 1]])
    rows, best, best_sse = design / t[:, None], np.zeros(3), float(len(t))  # zero fit: sse = n
    for cols in itertools.chain(*(itertools.combinations(range(3), k) for k in (3, 2, 1))):
        coef = np.linalg.lstsq(rows[:, cols], np.ones_like(t), rcond=None)[0]
        full = np.zeros(3)
        full[list(cols)] = coef
        sse = float(np.sum((rows @ full - 1.0) ** 2))
        if np.all(coef >= 0) and sse < best_sse - 1e-12:
            best, best_sse = full, sse
    rel = design @ best / t - 1.0
    return Fit(
        fixed_s=float(best[0]),
        per_token_s=float(best[1]),
        per_kv_token_s=float(best[2]),
        rms_rel_error=float(np.sqrt(np.mean(rel**2))),
        max_rel_error=float(np.max(np.abs(rel))),
        clamped=tuple(name for name, c in zip(_NAMES, best, strict=True) if c == 0),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    device: str
    profile: str
    dtype: str
    cpu_threads: int
    shapes: LayerShapes
    """As measured (narrower than the profile's when width_scale < 1)."""
    layers_measured: int
    profile_layers: int
    width_scale: float
    tokens_per_seq: int
    repeats: int
    """Samples per point behind each median (fewer than asked if the budget ran out)."""
    measurements: tuple[tuple[int, int, float], ...]
    """(tokens, kv_tokens, median seconds) of the stack as built."""
    measured: Fit
    factors: tuple[float, float, float]
    """Measured-stack coefficient -> full-profile coefficient multipliers."""
    wall_s: float

    @property
    def fixed_s(self) -> float:
        return self.measured.fixed_s * self.factors[0]

    @property
    def per_token_s(self) -> float:
        return self.measured.per_token_s * self.factors[1]

    @property
    def per_kv_token_s(self) -> float:
        return self.measured.per_kv_token_s * self.factors[2]

    def to_step_time_model(self) -> StepTimeModel:
        """The full-profile fit (extrapolated as `factors` say)."""
        return StepTimeModel(
            fixed_s=self.fixed_s,
            per_token_s=self.per_token_s,
            per_kv_token_s=self.per_kv_token_s,
            source=f"probe {self.device} {self.profile}",
        )

    def to_dict(self) -> dict[str, Any]:
        full = dict(zip(_NAMES, (self.fixed_s, self.per_token_s, self.per_kv_token_s), strict=True))
        fields = asdict(self)
        factors = fields.pop("factors")  # named below rather than positional
        return {
            **full,
            "covers": "transformer layers measured, LM head extrapolated; no sampling",
            "extrapolation_factors": dict(zip(_NAMES, factors, strict=True)),
            **fields,
        }


Point = tuple[int, int, int, int, int]
"""(batch, new tokens per sequence, cached tokens per sequence, tokens, KV tokens)."""


def _point(tokens: int, kv: int, per_seq: int) -> Point:
    """Spread a step's tokens over sequences of `per_seq` (a verify step of K+1), each reading
    its own cache once for those few queries: that is what makes attention linear in total KV.
    Totals round down to what the split holds."""
    q = max(1, min(tokens, per_seq))
    batch = max(1, tokens // q)
    return batch, q, kv // batch, batch * q, kv // batch * batch


class _Bench:
    """The torch side: builds layers, times steps. Kept apart so that `run_probe` reads as the
    budget logic it is."""

    def __init__(self, torch: Any, dev: Any, seed: int) -> None:
        self.torch, self.dev, self.seed = torch, dev, seed
        self.cuda = dev.type == "cuda"
        # bf16 as served on GPUs; fp32 on CPUs, where bf16 matmuls without bf16 units ran
        # ~100x slower than fp32 (2-core AVX2 dev box) and would time the emulation.
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.sync = (lambda: torch.cuda.synchronize(dev)) if self.cuda else (lambda: None)

    def layer(self, sh: LayerShapes, index: int) -> list[Any]:
        # One generator per layer: weights depend on (seed, layer), not on calibration rounds.
        gen = self.torch.Generator(device=self.dev).manual_seed(self.seed + index)

        def w(inp: int, out: int) -> Any:  # (out, in) as nn.Linear; 1/sqrt(in): no denormals
            x = self.torch.randn(out, inp, generator=gen, device=self.dev)
            return (x / math.sqrt(inp)).to(self.dtype)

        h, a, kv, f = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate
        norms = [self.torch.ones(h, device=self.dev, dtype=self.dtype) for _ in range(2)]
        return [*norms, w(h, a), w(h, kv), w(h, kv), w(a, h), w(h, f), w(h, f), w(f, h)]

    def step(self, sh: LayerShapes, stack: list[list[Any]], point: Point) -> float:
        fn, (batch, q, cached, tokens, _) = self.torch.nn.functional, point
        shape = (2, batch, sh.kv_heads, cached + q, sh.head_dim)
        caches = [self.torch.zeros(shape, device=self.dev, dtype=self.dtype) for _ in stack]
        gen = self.torch.Generator(device=self.dev).manual_seed(self.seed)
        x = self.torch.randn(tokens, sh.hidden, generator=gen, device=self.dev).to(self.dtype)
        self.sync()
        t0 = time.perf_counter()
        for (n1, n2, wq, wk, wv, wo, wg, wu, wd), cache in zip(stack, caches, strict=True):
            h = fn.rms_norm(x, (sh.hidden,), n1)
            split = (batch, q, -1, sh.head_dim)
            # Written in place, as a paged cache is, rather than copying the old KV each step.
            cache[0, :, :, cached:] = fn.linear(h, wk).view(split).transpose(1, 2)
            cache[1, :, :, cached:] = fn.linear(h, wv).view(split).transpose(1, 2)
            qh = fn.linear(h, wq).view(split).transpose(1, 2)
            att = fn.scaled_dot_product_attention(qh, cache[0], cache[1], enable_gqa=True)
            x = x + fn.linear(att.transpose(1, 2).reshape(tokens, -1), wo)
            h = fn.rms_norm(x, (sh.hidden,), n2)
            x = x + fn.linear(fn.silu(fn.linear(h, wg)) * fn.linear(h, wu), wd)
        self.sync()
        return time.perf_counter() - t0

    def sweep(
        self, sh: LayerShapes, stack: list[list[Any]], grid: list[Point], passes: int, until: float
    ) -> tuple[list[float], int]:
        """Median seconds per point. Passes cover the whole grid in turn, so a burst of load
        from elsewhere spoils one sample of many points, not every sample of one; pass 0 warms
        each shape up (allocator, kernel choice). Stops early, keeping >= 1 pass, at `until`."""
        samples: list[list[float]] = [[] for _ in grid]
        done = 0
        for done in range(passes + 1):
            for point, out in zip(grid, samples, strict=True):
                seconds = self.step(sh, stack, point)
                if done:
                    out.append(seconds)
            if done and time.perf_counter() > until:
                break
        return [statistics.median(out) for out in samples], done


def run_probe(
    profile: ModelProfile,
    *,
    device: str = "auto",
    max_seconds: float = 90.0,
    token_sweep: Sequence[int] = TOKEN_SWEEP,
    kv_sweep: Sequence[int] = KV_SWEEP,
    layers: int | None = None,
    hidden_scale: float | None = None,
    tokens_per_seq: int = 4,
    repeats: int = 3,
    seed: int = 0,
    cpu_threads: int | None = None,
) -> ProbeResult:
    """Probe `profile` on `device` ("auto": CUDA if present, else CPU). Left None, `layers`
    and `hidden_scale` (a fraction of the width, in steps of one KV head) become the deepest
    (up to profile.layers) and widest stack whose sweep fits `max_seconds` and whose weights
    fit half the free memory; set, they are taken as given. `cpu_threads` sets torch's
    thread count for the run (on a shared CPU, 1 avoids the OpenMP stalls a busy neighbour
    core causes: median 4-token matmuls went from 0.27 to 16 ms with 2 threads on the dev box)."""
    _check(
        profile, token_sweep, kv_sweep, layers, hidden_scale, (tokens_per_seq, repeats, cpu_threads)
    )
    import torch

    start = time.perf_counter()
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    bench = _Bench(torch, torch.device(auto if device == "auto" else device), seed)
    memory = 0.5 * (torch.cuda.mem_get_info(bench.dev)[0] if bench.cuda else _available_ram())
    full = layer_shapes(profile)
    grid = [_point(n, kv, tokens_per_seq) for kv in sorted(kv_sweep) for n in sorted(token_sweep)]
    top, need = grid[-1], layers or 1
    spans = [max(p[3] / top[3], p[4] / max(top[4], 1)) for p in grid]

    def left() -> float:  # 15% headroom for the cost estimate's error
        return 0.85 * max_seconds - (time.perf_counter() - start)

    def layer_bytes(kv_heads: int) -> float:  # weights plus the largest point's KV cache
        sh = full.scaled(kv_heads)
        kv = 2 * (top[3] + top[4]) * sh.kv_heads * sh.head_dim
        return (2 if bench.cuda else 4) * (sh.params + kv)

    def calibrate(kv_heads: int) -> tuple[LayerShapes, list[list[Any]], float]:
        """One layer of this width, and the sweep's seconds per layer: an upper bound under the
        linear model (each point costs at most its larger share of the top corner's time)."""
        sh, t0 = full.scaled(kv_heads), time.perf_counter()
        stack = [bench.layer(sh, 0)]
        build = time.perf_counter() - t0
        (lo, hi), _ = bench.sweep(sh, stack, [grid[0], top], 1, math.inf)
        return sh, stack, build + (repeats + 1) * sum(lo + max(hi - lo, 0) * f for f in spans)

    kv_heads = 1 if hidden_scale is None else max(1, round(profile.kv_heads * hidden_scale))
    if layer_bytes(kv_heads) > memory:
        need_gb, free_gb = layer_bytes(kv_heads) / 1e9, memory / 1e9
        raise MemoryError(f"{profile.name}: one layer needs {need_gb:.1f} GB of {free_gb:.1f}")
    with contextlib.ExitStack() as restore, torch.inference_mode():
        restore.callback(torch.set_num_threads, torch.get_num_threads())
        threads = cpu_threads or torch.get_num_threads()
        torch.set_num_threads(threads)
        sh, stack, cost = calibrate(kv_heads)
        if hidden_scale is None:
            # Widest first: width is extrapolated less soundly than depth. Cost grows at most
            # as width^2 (fixed overheads and small-matrix inefficiency grow less), so each
            # widening, predicted from the last layer measured, errs narrow; repeat from the
            # wider one, then narrow again if it turned out too slow.
            while ok := [
                k
                for k in range(kv_heads + 1, profile.kv_heads + 1)
                if cost * (k / kv_heads) ** 2 * need <= left() and layer_bytes(k) <= memory
            ]:
                kv_heads = ok[-1]
                sh, stack, cost = calibrate(kv_heads)
            while kv_heads > 1 and cost * need > left():
                shrink = 0.9 * math.sqrt(max(left(), 0.0) / (cost * need))
                kv_heads = max(1, min(kv_heads - 1, int(kv_heads * shrink)))
                sh, stack, cost = calibrate(kv_heads)
        fit_layers = layers or max(1, int(left() // cost))
        depth = max(1, min(profile.layers, int(memory // layer_bytes(kv_heads)), fit_layers))
        stack += [bench.layer(sh, i) for i in range(1, depth)]
        seconds, done = bench.sweep(sh, stack, grid, repeats, start + max_seconds)
    runs = tuple((p[3], p[4], t) for p, t in zip(grid, seconds, strict=True))
    scale, deep = kv_heads / profile.kv_heads, profile.layers / depth
    # The LM head is one more matmul over every verified token, so its weight reads and FLOPs
    # add to fixed and per-token time in proportion to its weights.
    head = 1 + profile.lm_head_params / (profile.layers * active_layer_params(profile))
    return ProbeResult(
        device=torch.cuda.get_device_name(bench.dev) if bench.cuda else "cpu",
        profile=profile.name,
        dtype=str(bench.dtype).removeprefix("torch."),
        cpu_threads=threads,
        shapes=sh,
        layers_measured=depth,
        profile_layers=profile.layers,
        width_scale=scale,
        tokens_per_seq=tokens_per_seq,
        repeats=done,
        measurements=runs,
        measured=fit_step_time(runs),
        factors=(deep * head / scale**2, deep * head / scale**2, deep / scale),
        wall_s=time.perf_counter() - start,
    )


def _check(
    profile: ModelProfile,
    token_sweep: Sequence[int],
    kv_sweep: Sequence[int],
    layers: int | None,
    hidden_scale: float | None,
    counts: tuple[int, int, int | None],
) -> None:
    if len(set(token_sweep)) < 2 or min(token_sweep) < 1:
        raise ConfigError("token_sweep", token_sweep, "two or more distinct counts >= 1")
    if not kv_sweep or min(kv_sweep) < 0:
        raise ConfigError("kv_sweep", kv_sweep, "one or more counts >= 0")
    if layers is not None and not 1 <= layers <= profile.layers:
        raise ConfigError("layers", layers, f"None or 1..{profile.layers}")
    if hidden_scale is not None and not 0 < hidden_scale <= 1:
        raise ConfigError("hidden_scale", hidden_scale, "None or a fraction in (0, 1]")
    for name, value in zip(("tokens_per_seq", "repeats", "cpu_threads"), counts, strict=True):
        if value is not None and value < 1:
            raise ConfigError(name, value, "an integer >= 1")


def _available_ram() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not Linux: assume a modest machine
        return 8 << 30
