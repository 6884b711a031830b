"""`specpilot operator`: the Kubernetes operator (kopf) with peering for HA and probes.

Contract: runs kopf with the handlers of `specpilot.operator.kube.handlers`, cluster-wide or in
the given namespaces. HA: run 2 replicas with the same `--peering` name; each takes a random
priority at start (or `--priority`), so exactly one is active and the other pauses until the
active one's keep-alive stops (kopf peering; the peering object is created when missing).
`--standalone` turns peering off (one replica). Liveness/readiness: kopf's probe endpoint
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
import os
import random
import re

from specpilot.tuner import ConfigError

PRIORITY_RANGE = 1_000_000
"""Random priorities from a range this wide make a tie between two replicas negligible."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("operator", help="run the Kubernetes operator (kopf, with peering)")
    parser.add_argument(
        "--namespace", action="append", default=[], help="watch only this namespace (repeatable)"
    )
    parser.add_argument("--peering", default="specpilot", help="kopf peering object name")
    parser.add_argument("--standalone", action="store_true", help="no peering (one replica)")
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
    if len(ns.peering) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, ns.peering):
        raise ConfigError("--peering", ns.peering, "a lowercase DNS subdomain name")


def run(ns: argparse.Namespace) -> int:
    import kopf

    from specpilot.operator.app.cluster_check import check_cluster
    from specpilot.operator.kube import handlers  # noqa: F401 - registers the handlers
    from specpilot.operator.kube.monitor_labels import configured_monitor_labels
    from specpilot.operator.kube.url_policy import UrlAllowList

    url_policy = UrlAllowList.configured(ns.prometheus_url_allow)  # a bad prefix fails here
    _check_flags(ns)
    # The installer's monitor labels and the cluster are checked before kopf starts: kopf
    # retries an unreachable cluster forever, and bad labels would fail every reconcile.
    configured_monitor_labels()
    check_cluster(ns.kubeconfig)

    if ns.kubeconfig:  # kopf's own login reads the environment, like the kubernetes client
        os.environ["KUBECONFIG"] = ns.kubeconfig
    kopf.configure(verbose=ns.verbose)
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
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
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
    return 0
