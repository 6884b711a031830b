"""Which Prometheus URLs the operator may fetch: an allow-list of URL prefixes.

Contract: `spec.tuning.metrics.prometheusUrl` is written by anyone who may edit a
SpecDeployment in their namespace, and the operator fetches it from inside the cluster, so
it fetches only URLs under a prefix the operator's installer allowed: the repeatable flag
`--prometheus-url-allow` and the comma-separated environment variable `ALLOW_ENV` (the Helm
chart sets it from `prometheus.allowedUrls`, by default its `prometheus.url`). With neither,
nothing is allowed (there is no operator-wide default Prometheus), and a SpecDeployment that
asks for one gets a status condition instead (operator/kube/metrics_condition.py). A prefix
that is not an http(s) URL with a host is a `ConfigError` naming where it came from.

A prefix matches on parsed parts, not characters, so `http://prom:9090` allows
`http://prom:9090/` and `http://prom:9090/sub` but never `http://prom:9090.evil.example`,
`http://prom:90901` or `http://user@prom:9090`: scheme and host equal (case-insensitive), the
port equal when the prefix names one (a prefix without a port allows every port of its
host), and the path a prefix on a `/` boundary. A URL with credentials, whitespace, control
characters, a backslash or a `.`/`..` path segment (plain or percent-encoded) is never
allowed: HTTP clients and servers read those differently from this parser, which is how an
allow-list is walked around.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from specpilot.tuner import ConfigError

ALLOW_ENV = "SPECPILOT_PROMETHEUS_URL_ALLOW"
FLAG = "--prometheus-url-allow"
FIELD = "spec.tuning.metrics.prometheusUrl"
PREFIX_FORM = "an http(s) URL prefix with a host, e.g. http://prometheus.monitoring:9090"


@dataclass(frozen=True, slots=True)
class UrlAllowList:
    prefixes: tuple[str, ...]

    @classmethod
    def configured(
        cls, flags: Iterable[str] = (), env: Mapping[str, str] | None = None
    ) -> UrlAllowList:
        """The flags' prefixes plus the environment variable's (comma-separated)."""
        environ = os.environ if env is None else env
        found = [(FLAG, p.strip()) for p in flags]
        found += [(ALLOW_ENV, p.strip()) for p in environ.get(ALLOW_ENV, "").split(",")]
        for source, prefix in found:
            if prefix and _parts(prefix) is None:
                raise ConfigError(source, prefix, PREFIX_FORM)
        return cls(tuple(dict.fromkeys(p for _, p in found if p)))

    def allows(self, url: str) -> bool:
        return any(_under(url, prefix) for prefix in self.prefixes)

    def refusal(self, url: str) -> str:
        """Why `url` is refused, naming the field and what is allowed."""
        allowed = ", ".join(self.prefixes) if self.prefixes else "none configured"
        return (
            f"{FIELD} {url!r} is not under an allowed prefix (allowed: {allowed}); the "
            f"operator's installer allows prefixes with {FLAG} or {ALLOW_ENV}"
        )


def _parts(url: str) -> urllib.parse.SplitResult | None:
    """The URL split, or None when it is not one this policy can judge safely."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in url):
        return None  # urlsplit silently drops tabs and newlines; clients may not
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None:
        return None  # credentials in a URL make its host ambiguous to readers
    segments = urllib.parse.unquote(parts.path).split("/")
    if any(s in (".", "..") for s in segments) or "\\" in urllib.parse.unquote(parts.path):
        return None  # a server resolves these, escaping the allowed path
    return parts


def _under(url: str, prefix: str) -> bool:
    got, allowed = _parts(url), _parts(prefix)
    if got is None or allowed is None:
        return False
    if (got.scheme.lower(), got.hostname) != (allowed.scheme.lower(), allowed.hostname):
        return False
    if allowed.port is not None and got.port != allowed.port:
        return False
    base = allowed.path.rstrip("/")
    return got.path == base or got.path.startswith(base + "/") or (not base and not got.path)
