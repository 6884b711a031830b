"""Faults the mock API server injects for a while, then stops: `fail_next(api, ...)`. A MOCK.

Usage:

    fault = fail_next(api, "get", "apps", "v1", "deployments", status=503, times=1)
    ...                 # the next matching request is answered 503 (a Status body), the ones
    fault.hits          # after it are served by the store again; hits counts the failures

KMock's DSL puts a reaction in front of the realism layer's store. Its criterion may be asked
about the same request more than once (while the request is served, and again whenever a test
reads the request log), so it decides once per request id and remembers, and it never picks a
request made before the fault was installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kmock

from kube.apiserver import ApiServer
from kube.realism import RealisticKubernetes


@dataclass
class Fault:
    first_id: int
    times: int
    chosen: set[int] = field(default_factory=set)

    def __call__(self, request: kmock.Request) -> bool:
        if request.id in self.chosen:
            return True
        if request.id < self.first_id or len(self.chosen) >= self.times:
            return False
        self.chosen.add(request.id)
        return True

    @property
    def hits(self) -> int:
        return len(self.chosen)


def fail_next(
    api: ApiServer,
    method: str,
    group: str,
    version: str,
    plural: str,
    *,
    status: int = 503,
    times: int = 1,
) -> Fault:
    def install(kube: RealisticKubernetes) -> Fault:
        fault = Fault(first_id=len(kube), times=times)  # the next request's id
        message = f"HTTP {status} injected by the test (a mock)"
        body = {"kind": "Status", "status": "Failure", "code": status, "message": message}
        kube[method, kmock.resource(group, version, plural), fault] << status << body
        return fault

    return api.call(install)
