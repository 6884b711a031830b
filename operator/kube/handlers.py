"""kopf registration for SpecDeployments: thin handlers over plain functions. Nothing else.

Contract: importing this module registers, in kopf's default registry,
- startup: kopf settings (progress and diff-base in `specpilot.io/` annotations, since the
  CRD's structural status would prune kopf's own status fields, the diff-base with literal env
  values as digests; only warnings become kopf's Events; no object body in its debug log),
  the peering object for HA created when missing, the metrics endpoint;
- create / update / resume: `reconcile.reconcile` under the object's lock; an invalid spec is
  a `kopf.PermanentError` (status already says Degraded), a lost write race or an API failure
  a `kopf.TemporaryError` (retried);
- a daemon per object beating every `BEAT_S`, its first beat at its own phase of the tuning
  interval (beat.tick_phase): reconcile again (drift repair, status from the
  live Deployment), then `tuning.tune`, which runs a tick only every
  spec.tuning.intervalSeconds. A daemon rather than a timer because kopf hands daemons a stop
  flag: every wait inside a tick goes through it, so operator exit, a peering pause and the
  object's deletion interrupt a tick instead of waiting out a window or a rollout. The daemon
  is async and each beat runs on the operator's tick pool (operator/kube/beat.py), so no daemon
  holds a thread of kopf's executor, which the create and update handlers need;
- cleanup: the tick pool is shut down;
- delete (optional: no finalizer, so deleting never waits for the operator): the children go
  with the object through their ownerReferences; only in-memory caches and metrics are dropped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from typing import Any

import kopf

from specpilot.operator.api.names import FINALIZER, GROUP, KOPF_ANNOTATION_PREFIX, PLURAL, VERSION
from specpilot.operator.api.spec import SpecError, decode_spec
from specpilot.operator.kube import beat, exported_metrics, tuning_daemon
from specpilot.operator.kube.client import KubeApiError, KubeConflict, KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.url_policy import UrlAllowList

BEAT_S = 5.0
"""The daemon's beat; equal to the smallest allowed spec.tuning.intervalSeconds."""


def _rest(memo: Any) -> KubeRest:
    rest: KubeRest = memo.rest
    return rest


def _url_policy(memo: Any) -> UrlAllowList:
    """The allow-list `specpilot operator` put in the memo (flags and environment), else the
    environment's alone (kopf run another way)."""
    policy = getattr(memo, "url_policy", None)
    return policy if isinstance(policy, UrlAllowList) else UrlAllowList.configured()


class EnvValueDigests(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled configuration, an annotation on the object that its debug log also
    prints, with each literal env value replaced by its digest: a credential written inline
    in spec.env is copied nowhere, and a changed value still reads as a change."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        env = (essence.get("spec") or {}).get("env")
        for var in env if isinstance(env, list) else []:
            if isinstance(var, dict) and isinstance(var.get("value"), str):
                digest = hashlib.sha256(var["value"].encode()).hexdigest()[:16]
                var["value"] = f"sha256:{digest}"
        return essence


class NoBodies(logging.Filter):
    """kopf's debug log prints a whole object as a handler starts ("Creation is in progress:
    {...}"), env values written in the spec included: the object is cut from the line."""

    MARK = " is in progress: "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.MARK in message:
            record.msg = message.split(self.MARK, 1)[0] + " is in progress (object not logged)"
            record.args = None
        return True


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=KOPF_ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = EnvValueDigests(
        prefix=KOPF_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # kopf's finalizer (its timers need one), named for this operator.
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, NoBodies) for f in objects.filters):
        objects.addFilter(NoBodies())
    settings.execution.max_workers = max(settings.execution.max_workers or 0, 16)
    memo.rest = KubeRest.from_config(getattr(memo, "kubeconfig", None))
    memo.ticks = beat.tick_pool()
    if not settings.peering.standalone and settings.peering.mandatory:
        ensure_peering(memo.rest, settings.peering.name, getattr(memo, "namespace", None))
    exported_metrics.serve(int(getattr(memo, "metrics_port", 0) or 0))


def ensure_peering(rest: KubeRest, name: str, namespace: str | None) -> None:
    """kopf pauses a mandatory peering until its object exists; it never creates one."""
    plural = "kopfpeerings" if namespace else "clusterkopfpeerings"
    kind = "KopfPeering" if namespace else "ClusterKopfPeering"
    if rest.get("kopf.dev/v1", plural, namespace, name) is None:
        meta = {"name": name, **({"namespace": namespace} if namespace else {})}
        try:
            rest.create({"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta})
        except KubeConflict:
            pass  # the other replica created it first
        except KubeApiError as exc:  # e.g. no RBAC to create it: the Helm chart does instead
            logging.getLogger(__name__).warning(f"cannot create peering {name!r}: {exc}")


def _reconcile(body: kopf.Body, memo: kopf.Memo) -> None:
    meta = body["metadata"]
    with tuning_daemon.object_lock(meta["namespace"], meta["name"]):
        try:
            reconcile(_rest(memo), body)
        except SpecError as exc:
            raise kopf.PermanentError(str(exc)) from None
        except KubeConflict as exc:
            raise kopf.TemporaryError(f"the object changed meanwhile: {exc}", delay=1) from None
        except KubeApiError as exc:
            raise kopf.TemporaryError(str(exc), delay=10) from None


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_spec(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(body, memo)


@kopf.daemon(GROUP, VERSION, PLURAL, initial_delay=BEAT_S, cancellation_timeout=BEAT_S)
async def tune_forever(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    meta = body["metadata"]

    def one_beat(sleep: beat.Sleep) -> None:
        try:
            _reconcile(body, memo)
            timer = exported_metrics.TickTimer(sleep)
            with tuning_daemon.object_lock(meta["namespace"], meta["name"]):
                outcome = tuning_daemon.tune(
                    _rest(memo), body, sleep=timer.sleep, url_policy=_url_policy(memo)
                )
            if outcome is not None:
                timer.observe()
                logger.info(f"tuning: {outcome.action}: {outcome.reason}")
        except (kopf.PermanentError, kopf.TemporaryError, KubeApiError) as exc:
            # Degraded is in status, or the API hiccuped: keep beating, the next beat retries.
            logger.debug(f"beat skipped: {exc}")

    await beat.run_beats(
        stopped, one_beat, pool=memo.ticks, every_s=BEAT_S, first_after_s=_first_beat_s(body)
    )


def _first_beat_s(body: kopf.Body) -> float:
    """Where in its interval this object's ticks fall (beat.tick_phase); none for a spec that
    does not decode (reconcile reports it; nothing ticks)."""
    meta = body["metadata"]
    try:
        interval = decode_spec(dict(body.get("spec") or {})).tuning.interval_s
    except SpecError:
        return 0.0
    return beat.tick_phase(str(meta["namespace"]), str(meta["name"])) * float(interval)


@kopf.on.cleanup()
def stop_ticks(memo: kopf.Memo, **_: Any) -> None:
    memo.ticks.shutdown(wait=False, cancel_futures=True)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(meta: kopf.Meta, **_: Any) -> None:
    namespace, name = str(meta["namespace"]), str(meta["name"])
    tuning_daemon.forget(namespace, name)
    exported_metrics.forget(namespace, name)
