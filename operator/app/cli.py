"""The `specpilot` command. Subcommands present so far: render, parse, observe, simulate,
emulate, probe, run, bench.

Contract: a mistake in the user's input (a bad config, an unknown engine, unreachable metrics)
prints one `error: ...` line naming the field and the allowed values and exits 2; no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specpilot.operator.app import operator_command, run_command, simulate_command
from specpilot.operator.app.bench import command as bench_command
from specpilot.operator.app.demo import command as demo_command
from specpilot.runtime.engine_metrics import observe, observe_per_pod
from specpilot.runtime.engines import ADAPTERS, LaunchSettings, get_adapter
from specpilot.runtime.promql import PromQLError, PromQLReader
from specpilot.runtime.scrape import ScrapeError
from specpilot.runtime.window import WindowReader
from specpilot.tuner import PROFILES, ConfigError, SpecConfig, get_profile


def _render(ns: argparse.Namespace) -> int:
    adapter = get_adapter(ns.engine)
    config = SpecConfig.from_json(ns.config)
    base = LaunchSettings(
        model=ns.model,
        served_model_name=ns.served_model_name,
        host=ns.host,
        port=ns.port,
        extra_args=tuple(ns.extra_args),
        sidecar_dir=ns.sidecar_dir,
    )
    args = adapter.render(config, base)
    for path, content in adapter.sidecar_files(config, base).items():
        if ns.write_sidecars:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content, encoding="utf-8")
        else:
            print(f"# {path} (write it with --write-sidecars):\n{content}", file=sys.stderr)
    print(shlex.join(args))
    return 0


def _parse(ns: argparse.Namespace) -> int:
    config = get_adapter(ns.engine).parse(ns.args)
    print(config.to_json())
    return 0


def _observe(ns: argparse.Namespace) -> int:
    if ns.prometheus:
        reader = PromQLReader(ns.prometheus, pod_label=ns.pod_label, selector=ns.selector)
        stats = reader.window_stats(ns.engine, ns.window, time.time())
    else:
        if not ns.url:
            raise ConfigError("--url", None, "one or more /metrics URLs, or --prometheus URL")
        scraper = WindowReader(interval_s=ns.interval, timeout_s=ns.interval + 5, fail_fast=True)
        stats = scraper.read(ns.engine, {url: url for url in ns.url}, ns.window).complete()
    report = {
        "aggregate": observe(ns.engine, stats).to_dict(),
        "per_pod": {pod: o.to_dict() for pod, o in observe_per_pod(ns.engine, stats).items()},
    }
    print(json.dumps(report, indent=2))
    return 0


def _probe(ns: argparse.Namespace) -> int:
    from specpilot.runtime.probe import run_probe

    result = run_probe(
        get_profile(ns.model_profile), device=ns.device, max_seconds=ns.max_seconds, seed=ns.seed
    )
    print(json.dumps(result.to_dict(), indent=None if ns.json else 2))
    return 0


def _emulate(argv: Sequence[str]) -> int:
    from specpilot.runtime.emulator.server import parse_settings, serve

    settings = parse_settings(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specpilot", description="Speculative decoding, tuned to the traffic."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    engines = sorted(ADAPTERS)

    render = sub.add_parser("render", help="print an engine command line for a SpecConfig")
    render.add_argument("--engine", required=True, choices=engines)
    render.add_argument("--config", required=True, help='SpecConfig JSON, e.g. {"method":"none"}')
    render.add_argument("--model", required=True)
    render.add_argument("--served-model-name")
    render.add_argument("--host", default="0.0.0.0")
    render.add_argument("--port", type=int, default=8000)
    render.add_argument("--sidecar-dir", default="/etc/specpilot")
    render.add_argument("--write-sidecars", action="store_true")
    render.add_argument("extra_args", nargs=argparse.REMAINDER, help="after --: engine flags")
    render.set_defaults(run=_render)

    parse = sub.add_parser("parse", help="print the SpecConfig an engine command line runs")
    parse.add_argument("--engine", required=True, choices=engines)
    parse.add_argument("args", nargs=argparse.REMAINDER, help="after --: the engine's arguments")
    parse.set_defaults(run=_parse)

    obs = sub.add_parser("observe", help="one Observation from /metrics URLs or Prometheus")
    obs.add_argument("--engine", required=True, choices=engines)
    obs.add_argument("--url", action="append", help="an engine /metrics URL (repeatable)")
    obs.add_argument("--prometheus", help="Prometheus base URL (PromQL instead of scraping)")
    obs.add_argument("--pod-label", default="pod")
    obs.add_argument("--selector", default="", help='PromQL label matchers, e.g. job="llm"')
    obs.add_argument("--window", type=float, default=10.0, help="seconds")
    obs.add_argument("--interval", type=float, default=1.0, help="scrape interval, seconds")
    obs.set_defaults(run=_observe)

    simulate_command.add_parser(sub)
    run_command.add_parser(sub)
    bench_command.add_parser(sub)
    operator_command.add_parser(sub)
    demo_command.add_parser(sub)

    emulate = sub.add_parser(
        "emulate",
        help="serve an emulated vLLM/SGLang: specpilot emulate --engine vllm [--gpu H100] "
        "[--model-profile llama-3.1-8b] [--load-delay S] <the engine's own arguments>",
        add_help=False,
    )
    emulate.add_argument("argv", nargs=argparse.REMAINDER)

    probe = sub.add_parser(
        "probe", help="measure this device's step time with torch and fit t = a + b*tokens + c*kv"
    )
    probe.add_argument("--model-profile", default="llama-3.1-8b", help=" | ".join(PROFILES))
    probe.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    probe.add_argument("--max-seconds", type=float, default=90.0, help="time budget")
    probe.add_argument("--seed", type=int, default=0)
    probe.add_argument("--json", action="store_true", help="compact JSON on one line")
    probe.set_defaults(run=_probe)
    emulate.set_defaults(run=lambda ns: _emulate(ns.argv))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["emulate"]:
        # The engine's own flags follow; argparse must not try to read them.
        return _guarded(lambda: _emulate(args[1:]))
    ns = build_parser().parse_args(args)
    ns.argv = args  # what the user typed, for result files that record their command
    for name in ("extra_args", "args"):
        value = getattr(ns, name, None)
        if value and value[0] == "--":
            setattr(ns, name, value[1:])
    return _guarded(lambda: int(ns.run(ns)))


def _guarded(run: Callable[[], int]) -> int:
    try:
        return run()
    except (ConfigError, ScrapeError, PromQLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
