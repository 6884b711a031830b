"""Retrying the Kubernetes API's transient failures, within a bounded budget.

Contract: `with_retries(call, sleep=...)` returns `call()`'s result; a `KubeTransient` (a 429
or 5xx answer, a timeout, a connection refused or reset: operator/kube/client.py) is retried
after a wait that doubles from `first_delay_s`, at most `RETRIES` times, and then re-raised.
Any other error is raised at once: a 4xx is an answer, not a hiccup, and retrying it would only
delay the failure it reports. Waits go through `sleep`, the tick's interruptible one, so a stop
during a retry ends the tick as any other wait does.

Why: a rollout is followed for minutes through many calls; one API server restart or one
overloaded apiserver answering 503 must not read as a failed rollout, which would roll a good
switch back and back its config off for an hour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from specpilot.operator.kube.client import KubeTransient

T = TypeVar("T")
RETRIES = 4
"""Retries after the first attempt: with the default first delay, 1 + 2 + 4 + 8 = 15 s of
waiting, longer than an apiserver's usual restart behind a load balancer."""
FIRST_DELAY_S = 1.0


def with_retries(
    call: Callable[[], T],
    *,
    sleep: Callable[[float], None],
    retries: int = RETRIES,
    first_delay_s: float = FIRST_DELAY_S,
) -> T:
    delay = first_delay_s
    for _ in range(retries):
        try:
            return call()
        except KubeTransient:
            sleep(delay)
            delay *= 2
    return call()
