"""A guard for `specpilot operator --standalone`: at most one live operator per peering object.

Contract: `StandaloneGuard(rest, peering=..., namespace=..., identity=...)`.
- `acquire()` before kopf starts: reads the peering object kopf itself would use (the
  ClusterKopfPeering `peering`, or the KopfPeering of that name in `namespace`; created when
  missing). Entries of other operators that are past their deadline are dead and removed. While
  another entry is live, it waits, re-reading it: an entry that is refreshed meanwhile belongs
  to a running operator (kopf peering or another standalone), and `acquire` raises
  `GuardRefused`, naming it; one that reaches its deadline unrefreshed was left by a killed
  operator (its replacement starts this way), and the guard takes the object. The entry is
  written with the resourceVersion it was read at, so of two operators starting at once one
  writes and the other re-reads and waits on it.
- `hold(stop)` on a thread while kopf runs: refreshes the entry every `lifetime_s / 4`; returns
  None once `stop` is set, or a message when the hold is lost (the entry removed by an operator
  that found it dead, which happens only if this one stalled past its lifetime, or another
  standalone entry that started earlier), on which the caller stops kopf.
- `release()` removes the entry (a graceful exit lets a replacement start at once).
Why: kopf's own peering protection is off in standalone mode, so two `--standalone` operators
(a second Helm release, a developer's laptop against the cluster) would both patch the same
Deployments and undo each other's switches. The entry looks like a kopf peer with the highest
priority, so kopf peering operators sharing the object pause in favour of it.
"""

from __future__ import annotations

import datetime
import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specpilot.operator.kube.client import KubeApiError, KubeConflict, KubeRest

logger = logging.getLogger(__name__)
PEERING_API = "kopf.dev/v1"
STANDALONE_PRIORITY = 2**31 - 1
"""Above any kopf peering priority a replica picks (`PRIORITY_RANGE`): peers pause for it."""
LIFETIME_S = 60
"""Seconds an entry stays live without a refresh: kopf peering's default lifetime."""
POLL_FRACTION = 0.25
"""The guard re-reads (and refreshes its own entry) every this much of the lifetime."""


class GuardRefused(RuntimeError):
    """Another live operator holds the peering object (one-line message naming it)."""


@dataclass(frozen=True, slots=True)
class Holder:
    identity: str
    lastseen: datetime.datetime
    lifetime_s: float
    standalone: bool
    since: str

    @property
    def deadline(self) -> datetime.datetime:
        return self.lastseen + datetime.timedelta(seconds=self.lifetime_s)

    def describe(self) -> str:
        kind = "a standalone operator" if self.standalone else "a kopf peering operator"
        return f"{kind} {self.identity!r} (last seen {self.lastseen.isoformat()})"


def own_identity() -> str:
    """The pod's name where the chart sets POD_ID (as kopf names peers), else user@host/pid."""
    pod = os.environ.get("POD_ID")
    return pod or f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _holder(identity: str, entry: Any) -> Holder | None:
    """None for an entry no operator could have written (it is then ignored, not trusted)."""
    if not isinstance(entry, Mapping):
        return None
    try:
        lastseen = datetime.datetime.fromisoformat(str(entry["lastseen"]))
        lifetime = float(entry.get("lifetime", LIFETIME_S))
    except (KeyError, ValueError, TypeError):
        return None
    if lastseen.tzinfo is None:
        lastseen = lastseen.replace(tzinfo=datetime.UTC)
    return Holder(identity, lastseen, lifetime, bool(entry.get("standalone")),
                  str(entry.get("since", "")))  # fmt: skip


@dataclass
class StandaloneGuard:
    rest: KubeRest
    peering: str
    namespace: str | None
    identity: str = field(default_factory=own_identity)
    lifetime_s: int = LIFETIME_S
    clock: Callable[[], datetime.datetime] = _utcnow
    sleep: Callable[[float], None] = time.sleep
    since: str = ""

    @property
    def where(self) -> str:
        kind = "KopfPeering" if self.namespace else "ClusterKopfPeering"
        return f"{kind} {self.peering!r}" + (f" in {self.namespace!r}" if self.namespace else "")

    @property
    def _plural(self) -> str:
        return "kopfpeerings" if self.namespace else "clusterkopfpeerings"

    def acquire(self) -> None:
        try:
            self._acquire()
        except KubeApiError as exc:  # e.g. no RBAC for the peering object: one line, no trace
            raise GuardRefused(f"cannot take {self.where}: {exc}") from exc

    def _acquire(self) -> None:
        first_seen: dict[str, datetime.datetime] = {}
        while True:
            peering = self._read_or_create()
            now = self.clock()
            holders = self._holders(peering)
            live = [h for h in holders if h.identity != self.identity and h.deadline > now]
            refreshed = [h for h in live if first_seen.get(h.identity, h.lastseen) < h.lastseen]
            if refreshed:
                raise GuardRefused(
                    f"{self.where} is held by {refreshed[0].describe()}, which is running: "
                    "stop it, or run the operators with peering (without --standalone)"
                )
            if not live:
                if self._write(peering, [h for h in holders if h.identity != self.identity]):
                    logger.info(f"standalone guard: holding {self.where} as {self.identity!r}")
                    return
                continue  # the object changed under us: judge it again
            for h in live:
                first_seen.setdefault(h.identity, h.lastseen)
            wait = min((h.deadline - now).total_seconds() for h in live)
            logger.warning(
                f"standalone guard: {self.where} names {live[0].describe()}; waiting up to "
                f"{wait:.0f} s: if it refreshes its entry, this operator refuses to start"
            )
            self.sleep(max(0.1, min(wait + 0.5, self.lifetime_s * POLL_FRACTION)))

    def hold(self, stop: threading.Event) -> str | None:
        while not stop.wait(self.lifetime_s * POLL_FRACTION):
            try:
                lost = self._refresh()
            except KubeApiError as exc:  # the next round tries again; kopf keeps serving
                logger.warning(f"standalone guard: cannot refresh {self.where}: {exc}")
                continue
            if lost is not None:
                return lost
        return None

    def release(self) -> None:
        try:
            self.rest.patch(PEERING_API, self._plural, self.namespace, self.peering,
                            {"status": {self.identity: None}})  # fmt: skip
        except KubeApiError as exc:  # it expires on its own after its lifetime
            logger.warning(f"standalone guard: cannot remove the entry in {self.where}: {exc}")

    def _refresh(self) -> str | None:
        peering = self.rest.get(PEERING_API, self._plural, self.namespace, self.peering)
        holders = self._holders(peering or {})
        if not any(h.identity == self.identity for h in holders):
            return (
                f"this operator's entry in {self.where} was removed (it missed its refreshes "
                "for a whole lifetime and another operator took over); stopping"
            )
        now = self.clock()
        for h in holders:
            if h.identity == self.identity or not h.standalone or h.deadline <= now:
                continue
            if (h.since, h.identity) < (self.since, self.identity):
                return f"{self.where} is also held by {h.describe()}, which started first; stopping"
        self.rest.patch(PEERING_API, self._plural, self.namespace, self.peering,
                        {"status": {self.identity: self._entry()}})  # fmt: skip
        return None

    def _read_or_create(self) -> dict[str, Any]:
        found = self.rest.get(PEERING_API, self._plural, self.namespace, self.peering)
        if found is not None:
            return found
        kind = "KopfPeering" if self.namespace else "ClusterKopfPeering"
        meta = {"name": self.peering, **({"namespace": self.namespace} if self.namespace else {})}
        try:
            return self.rest.create({"apiVersion": PEERING_API, "kind": kind, "metadata": meta})
        except KubeConflict:  # created by another operator meanwhile
            again = self.rest.get(PEERING_API, self._plural, self.namespace, self.peering)
            return again or {}

    def _holders(self, peering: Mapping[str, Any]) -> list[Holder]:
        status = peering.get("status")
        entries = status.items() if isinstance(status, Mapping) else ()
        return [h for ident, entry in entries if (h := _holder(str(ident), entry)) is not None]

    def _write(self, peering: Mapping[str, Any], dead: list[Holder]) -> bool:
        """Our entry (and the dead ones removed) at the version judged; False on a conflict."""
        self.since = self.since or self.clock().isoformat()
        version = (peering.get("metadata") or {}).get("resourceVersion")
        patch: dict[str, Any] = {
            "status": {**{h.identity: None for h in dead}, self.identity: self._entry()}
        }
        if version:
            patch["metadata"] = {"resourceVersion": version}
        try:
            self.rest.patch(PEERING_API, self._plural, self.namespace, self.peering, patch)
        except KubeConflict:
            return False
        return True

    def _entry(self) -> dict[str, Any]:
        return {
            "priority": STANDALONE_PRIORITY,
            "lifetime": self.lifetime_s,
            "lastseen": self.clock().isoformat(),
            "standalone": True,
            "since": self.since,
        }
