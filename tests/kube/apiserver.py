"""The mock Kubernetes API server as a context manager: `running_apiserver()`. A MOCK.

Usage (any test, sync or async; the server runs on its own thread and event loop):

    from kube.apiserver import running_apiserver

    with running_apiserver(tmp_path) as api:
        api.url          # "http://127.0.0.1:PORT"
        api.kubeconfig   # Path of a kubeconfig for kubectl, kopf and the kubernetes client
        api.env()        # os.environ plus KUBECONFIG=api.kubeconfig, for subprocesses
        api.operator_kubeconfig, api.operator_env()  # the same as the operator's account
        api.denials()    # requests RBAC refused on the operator's account
        api.grants()     # requests RBAC let through on it ('verb group/resource')
        api.get("apps", "deployments", "default", "x")   # a snapshot dict, or None
        api.list("", "configmaps", namespace="default")  # snapshots, sorted by name
        api.call(lambda kube: ...)                       # run on the server's loop

With `operator_rules` (e.g. `kube.chart.operator_rules()`, the Helm chart's ClusterRole) the
server enforces them on the operator's account, as RBAC would: a request they do not grant is
403 Forbidden and listed in `denials()`. Without them the operator's account may do anything.
`crds` (default: every `crds/*.yaml` of the repository) are created at start, as
`kubectl apply` would, so their custom resources are in discovery at once. The server is a
`kube.realism.RealisticKubernetes` (KMock plus a realism layer; its docstring lists what it
does like a real API server); `api.kube` is that object, for KMock's DSL (fault injection,
request assertions) through `api.call`. Everything stops, watches included, on exit.
`tests/kube` is importable as `kube` because pytest puts `tests/` (the rootdir conftest's
folder) on sys.path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from kube.realism import RealisticKubernetes

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass(frozen=True)
class ApiServer:
    url: str
    kubeconfig: Path
    kube: RealisticKubernetes
    loop: asyncio.AbstractEventLoop
    operator_kubeconfig: Path

    def call(self, fn: Callable[[RealisticKubernetes], T], timeout: float = 10.0) -> T:
        """Run `fn(kube)` on the server's event loop (the store is not thread-safe)."""

        async def run() -> T:
            return fn(self.kube)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def get(self, group: str, plural: str, namespace: str | None, name: str) -> Any:
        key = (group, plural, namespace or "", name)
        return self.call(lambda kube: copy.deepcopy(kube.store.get(key)))

    def list(self, group: str, plural: str, namespace: str | None = None) -> list[Any]:
        def pick(kube: RealisticKubernetes) -> list[Any]:
            return [
                copy.deepcopy(obj)
                for (g, p, ns, _), obj in sorted(kube.store.items())
                if (g, p) == (group, plural) and namespace in (None, ns)
            ]

        return self.call(pick)

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def operator_env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.operator_kubeconfig)}

    def denials(self) -> list[str]:
        return self.call(lambda kube: list(kube.denials))

    def grants(self) -> list[str]:
        """Requests the operator's rules let through, as 'verb group/resource'."""
        return self.call(lambda kube: list(kube.grants))


ADMIN_TOKEN = "kmock"
OPERATOR_TOKEN = "system:serviceaccount:specpilot:specpilot"


def write_kubeconfig(path: Path, url: str, token: str = ADMIN_TOKEN) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        # The token names the account: the server enforces RBAC on the operator's only.
        "users": [{"name": "kmock", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kmock",
                "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"},
            }
        ],
        "current-context": "kmock",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def default_crds() -> list[Path]:
    return sorted((REPO / "crds").glob("*.yaml"))


@contextlib.contextmanager
def running_apiserver(
    workdir: Path,
    *,
    crds: Iterable[Path] | None = None,
    operator_rules: list[dict[str, Any]] | None = None,
) -> Iterator[ApiServer]:
    documents = [
        doc
        for path in (default_crds() if crds is None else crds)
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    started: concurrent.futures.Future[ApiServer] = concurrent.futures.Future()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            rbac = {} if operator_rules is None else {OPERATOR_TOKEN: operator_rules}
            async with RealisticKubernetes(rbac=rbac) as kube, kmock.Server(kube) as server:
                crd_kind = kube.kinds["apiextensions.k8s.io", "v1", "customresourcedefinitions"]
                for doc in documents:
                    kube.put_object(crd_kind, None, doc)
                url = str(server.url).rstrip("/")
                config = write_kubeconfig(workdir / "kubeconfig", url)
                operator = write_kubeconfig(workdir / "operator.kubeconfig", url, OPERATOR_TOKEN)
                started.set_result(ApiServer(url, config, kube, loop, operator))
                await stop.wait()
                kube.close_watches()
                await asyncio.sleep(0.05)  # let the streams end before the server closes
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
