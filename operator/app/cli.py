"""The `specpilot` command. Subcommands present so far: render, parse, observe, simulate,
emulate, probe, run, bench, operator, demo.

Contract: a mistake in the user's input (a bad config, an unknown engine, unreachable metrics)
prints one `error: ...` line naming the field and the allowed values and exits 2; no traceback.
`specpilot --version` prints the installed version. Every subcommand follows
`cli_conventions`: each option has help and shows its default, `--json [PATH]` means the same
everywhere, and long commands (bench, simulate, probe) show progress on a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from specpilot.operator.app import operator_command, run_command, simulate_command
from specpilot.operator.app.bench import command as bench_command
from specpilot.operator.app.cli_conventions import (
    add_json_option,
    apply_conventions,
    check_port,
    check_seconds,
    progress,
    write_json,
)
from specpilot.operator.app.cluster_check import ClusterUnreachable
from specpilot.operator.app.demo import command as demo_command
from specpilot.runtime.engine_metrics import observe, observe_per_pod
from specpilot.runtime.engines import ADAPTERS, LaunchSettings, get_adapter
from specpilot.runtime.local_engine import EngineStartError
from specpilot.runtime.promql import PromQLError, PromQLReader
from specpilot.runtime.scrape import ScrapeError
from specpilot.runtime.window import WindowReader
from specpilot.tuner import PROFILES, ConfigError, SpecConfig, get_profile


def _render(ns: argparse.Namespace) -> int:
    adapter = get_adapter(ns.engine)
    check_port("--port", ns.port)
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
    try:
        config = get_adapter(ns.engine).parse(ns.args)
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        # a value of the wrong type deep in the user's engine arguments (a schedule entry that
        # is not an integer): still their mistake, said in one line
        raise ConfigError(
            f"{ns.engine} arguments", shlex.join(ns.args), "the engine's own flag syntax", str(exc)
        ) from None
    print(config.to_json())
    return 0


def _observe(ns: argparse.Namespace) -> int:
    check_seconds("--window", ns.window, zero=True)  # 0: one reading, now
    check_seconds("--interval", ns.interval)
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

    profile = get_profile(ns.model_profile)
    check_seconds("--max-seconds", ns.max_seconds)
    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", ns.device):
        raise ConfigError("--device", ns.device, "auto | cpu | cuda | cuda:N")
    with progress(f"probing {profile.name} (budget {ns.max_seconds:g} s)", None):
        result = run_probe(profile, device=ns.device, max_seconds=ns.max_seconds, seed=ns.seed)
    if ns.json is not None:
        write_json(ns.json, result.to_dict())
        return 0
    print(
        f"{result.profile} on {result.device}: step time = {result.fixed_s * 1e3:.3f} ms"
        f" + {result.per_token_s * 1e6:.3f} us x tokens + {result.per_kv_token_s * 1e9:.3f} ns"
        f" x KV tokens ({result.layers_measured} of {result.profile_layers} layers measured,"
        f" {result.wall_s:.0f} s); write it with --json FILE for `run --step-time-fit FILE`"
    )
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
    parser.add_argument(
        "--version", action="version", version=f"specpilot {_version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    engines = sorted(ADAPTERS)

    render = sub.add_parser("render", help="print an engine command line for a SpecConfig")
    render.add_argument("--engine", required=True, choices=engines, help="engine to render for")
    render.add_argument("--config", required=True, help='SpecConfig JSON, e.g. {"method":"none"}')
    render.add_argument("--model", required=True, help="the served model's path or hub name")
    render.add_argument("--served-model-name", help="name clients ask for (default: --model)")
    render.add_argument("--host", default="0.0.0.0", help="address the engine binds")
    render.add_argument("--port", type=int, default=8000, help="port the engine binds")
    render.add_argument("--sidecar-dir", default="/etc/specpilot", help="where sidecar files go")
    render.add_argument(
        "--write-sidecars", action="store_true", help="write the sidecar files, not just name them"
    )
    render.add_argument("extra_args", nargs=argparse.REMAINDER, help="after --: engine flags")
    render.set_defaults(run=_render)

    parse = sub.add_parser("parse", help="print the SpecConfig an engine command line runs")
    parse.add_argument("--engine", required=True, choices=engines, help="engine whose flags")
    parse.add_argument("args", nargs=argparse.REMAINDER, help="after --: the engine's arguments")
    parse.set_defaults(run=_parse)

    obs = sub.add_parser("observe", help="one Observation from /metrics URLs or Prometheus")
    obs.add_argument("--engine", required=True, choices=engines, help="metric dialect")
    obs.add_argument("--url", action="append", help="an engine /metrics URL (repeatable)")
    obs.add_argument("--prometheus", help="Prometheus base URL (PromQL instead of scraping)")
    obs.add_argument("--pod-label", default="pod", help="label naming the pod in PromQL")
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
    emulate.add_argument(
        "argv", nargs=argparse.REMAINDER, help="specpilot emulate --help lists them"
    )

    probe = sub.add_parser(
        "probe", help="measure this device's step time with torch and fit t = a + b*tokens + c*kv"
    )
    probe.add_argument("--model-profile", default="llama-3.1-8b", help=" | ".join(PROFILES))
    probe.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    probe.add_argument("--max-seconds", type=float, default=90.0, help="time budget")
    probe.add_argument("--seed", type=int, default=0, help="random weights and inputs")
    add_json_option(probe, "the fit and every measurement")
    probe.set_defaults(run=_probe)
    emulate.set_defaults(run=lambda ns: _emulate(ns.argv))
    apply_conventions(parser)
    return parser


def _version() -> str:
    try:
        return metadata.version("specpilot")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


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
    except (ConfigError, ScrapeError, PromQLError, ClusterUnreachable, EngineStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
