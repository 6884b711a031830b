"""`specpilot operator`: the Kubernetes operator (kopf) with peering for HA and probes.

Contract: runs kopf with the handlers of `specpilot.operator.kube.handlers`, cluster-wide or in
the given namespaces. HA: run 2 replicas with the same `--peering` name; each takes a random
priority at start (or `--priority`), so exactly one is active and the other pauses until the
active one's keep-alive stops (kopf peering; the peering object is created when missing).
`--standalone` turns kopf's peering off (one replica); a guard (operator/kube/
standalone_guard.py) still records it in the peering object and refuses to start, with one
`error:` line and exit status 2, while another operator there is alive; it stops kopf (exit
status 1) if it loses that hold. Liveness/readiness: kopf's probe endpoint
(`--liveness URL`, or /healthz on `--liveness-port`, 0 for none; it answers once the
operator runs).
The operator's own Prometheus metrics are on `--metrics-port` (0 disables).
A SpecDeployment's `prometheusUrl` is fetched only under a prefix given with
`--prometheus-url-allow` (repeatable) or SPECPILOT_PROMETHEUS_URL_ALLOW (comma-separated; the
Helm chart sets it); with neither, none is (operator/kube/url_policy.py).
Before kopf starts, an unreachable cluster or unloadable credentials (operator/app/
cluster_check.py) or a bad SPECPILOT_MONITOR_LABELS is one `error:` line and exit status 2,
not a login retried forever.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from specpilot.tuner import ConfigError

if TYPE_CHECKING:
    from specpilot.operator.kube.standalone_guard import StandaloneGuard

PRIORITY_RANGE = 1_000_000
"""Random priorities from a range this wide make a tie between two replicas negligible."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("operator", help="run the Kubernetes operator (kopf, with peering)")
    parser.add_argument(
        "--namespace", action="append", default=[], help="watch only this namespace (repeatable)"
    )
    parser.add_argument("--peering", default="specpilot", help="kopf peering object name")
    parser.add_argument("--standalone", action="store_true", help="no peering (one replica)")
    parser.add_argument(
        "--standalone-lifetime",
        type=int,
        default=60,
        metavar="S",
        help="seconds a standalone operator's peering entry stays live unrefreshed (default 60)",
    )
    parser.add_argument("--priority", type=int, help="peering priority (default: random)")
    parser.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="probe port (0: no probe endpoint)"
    )
    parser.add_argument(
        "--liveness", help="probe endpoint URL (default http://0.0.0.0:<liveness-port>/healthz)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="operator metrics port (0: none)"
    )
    parser.add_argument(
        "--prometheus-url-allow",
        action="append",
        default=[],
        metavar="URL",
        help="a URL prefix SpecDeployments may name as prometheusUrl (repeatable; adds to "
        "$SPECPILOT_PROMETHEUS_URL_ALLOW, comma-separated); default: none",
    )
    parser.add_argument("--kubeconfig", help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument(
        "--verbose", action="store_true", help="log kopf's and the handlers' debug messages"
    )
    parser.set_defaults(run=run)


_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def _check_flags(ns: argparse.Namespace) -> None:
    """Ports a socket cannot bind and a peering name no object can have, before kopf starts
    (it would fail on them after logging in, or patch a peering object the server refuses)."""
    for flag, port in (("--liveness-port", ns.liveness_port), ("--metrics-port", ns.metrics_port)):
        if not 0 <= port <= 65535:
            raise ConfigError(flag, port, "a TCP port in 0..65535 (0: none)")
    if not 4 <= ns.standalone_lifetime <= 3600:
        raise ConfigError("--standalone-lifetime", ns.standalone_lifetime, "seconds in 4..3600")
    if len(ns.peering) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, ns.peering):
        raise ConfigError("--peering", ns.peering, "a lowercase DNS subdomain name")


def run(ns: argparse.Namespace) -> int:
    import kopf

    from specpilot.operator.app.cluster_check import check_cluster
    from specpilot.operator.app.malloc_arenas import limit_malloc_arenas
    from specpilot.operator.kube import handlers  # noqa: F401 - registers the handlers
    from specpilot.operator.kube.monitor_labels import configured_monitor_labels
    from specpilot.operator.kube.standalone_guard import GuardRefused
    from specpilot.operator.kube.url_policy import UrlAllowList

    limit_malloc_arenas()  # before kopf and the tick pool start their threads
    url_policy = UrlAllowList.configured(ns.prometheus_url_allow)  # a bad prefix fails here
    _check_flags(ns)
    # The installer's monitor labels and the cluster are checked before kopf starts: kopf
    # retries an unreachable cluster forever, and bad labels would fail every reconcile.
    configured_monitor_labels()
    check_cluster(ns.kubeconfig)

    if ns.kubeconfig:  # kopf's own login reads the environment, like the kubernetes client
        os.environ["KUBECONFIG"] = ns.kubeconfig
    kopf.configure(verbose=ns.verbose)
    if not ns.verbose:
        # httpx logs every request at INFO: one line per pod scrape buried the operator's own
        # lines, and at 200 SpecDeployments its tick threads spent most of a scrape queued on
        # the log handler's lock (py-spy, bench/results/operator_load.md)
        logging.getLogger("httpx").setLevel(logging.WARNING)
    namespaces: list[str] = ns.namespace
    if namespaces and ns.all_namespaces:
        raise ConfigError("--all-namespaces", True, "either it or --namespace, not both")
    priority = ns.priority if ns.priority is not None else random.randrange(PRIORITY_RANGE)
    memo = kopf.Memo(
        metrics_port=ns.metrics_port,
        kubeconfig=ns.kubeconfig,
        url_policy=url_policy,
        namespace=namespaces[0] if len(namespaces) == 1 else None,
    )
    try:
        guards = _standalone_guards(ns, namespaces) if ns.standalone else []
    except GuardRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    lost: list[str] = []
    holders = [_hold(guard, stop, lost) for guard in guards]
    try:
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
            _run_kopf(ns, namespaces, priority, memo)
    finally:
        stop.set()
        for thread in holders:
            thread.join()
        for guard in guards:
            guard.release()
    if lost:
        print(f"error: {lost[0]}", file=sys.stderr)
        return 1
    return 0


def _standalone_guards(ns: argparse.Namespace, namespaces: list[str]) -> list[StandaloneGuard]:
    """One guard per peering object kopf would use (cluster-wide, or each namespace's), all
    acquired, or none: a refusal releases those already held before it is raised."""
    from specpilot.operator.kube.client import KubeRest
    from specpilot.operator.kube.standalone_guard import StandaloneGuard

    rest = KubeRest.from_config(ns.kubeconfig)
    scopes: list[str | None] = [*namespaces] or [None]  # None: the cluster-wide peering
    guards = [StandaloneGuard(rest, ns.peering, n, lifetime_s=ns.standalone_lifetime)
              for n in scopes]  # fmt: skip
    held: list[StandaloneGuard] = []
    try:
        for guard in guards:
            guard.acquire()
            held.append(guard)
    except BaseException:
        for guard in held:
            guard.release()
        raise
    return guards


def _hold(guard: StandaloneGuard, stop: threading.Event, lost: list[str]) -> threading.Thread:
    def keep() -> None:
        why = guard.hold(stop)
        if why is not None:
            logging.getLogger(__name__).error(f"standalone guard: {why}")
            lost.append(why)
            # kopf's own graceful stop, as on `kubectl delete pod`; kopf.run's stop_flag would
            # leave an executor thread waiting on it, which holds the interpreter's exit
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=keep, name="standalone-guard", daemon=True)
    thread.start()
    return thread


def _run_kopf(
    ns: argparse.Namespace,
    namespaces: list[str],
    priority: int,
    memo: Any,
) -> None:
    import kopf

    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=ns.standalone,
        priority=priority,
        peering_name=None if ns.standalone else ns.peering,
        # kopf reads port 0 in a URL as HTTP's 80: no port means no endpoint here
        liveness_endpoint=ns.liveness
        or (f"http://0.0.0.0:{ns.liveness_port}/healthz" if ns.liveness_port else None),
        memo=memo,
    )
