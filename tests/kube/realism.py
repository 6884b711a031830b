"""KMock with a realism layer: a mock Kubernetes API server that kopf and kubectl accept.

THIS IS A MOCK. `RealisticKubernetes` keeps KMock's HTTP server, request log, DSL (tests can
still inject faults: `kube['patch', kmock.resource('apps', 'v1', 'deployments')] << 500`),
discovery scaffold and Status rendering, and replaces KMock's naive object store with one that
closes the gaps REFERENCE.md section 6 lists:
- server-set uid, resourceVersion (one global counter), generation (bumped when anything but
  metadata and status changes), creationTimestamp, namespace; no-op writes change nothing;
- POST/PUT/PATCH/DELETE; merge patch, strategic merge patch (as merge patch), JSON patch; a
  failed JSON-patch `test` is 422 Invalid; a stale resourceVersion is 409 Conflict;
- real /status (status writes ignore the rest; other writes ignore status; status is dropped
  on create) and /scale (autoscaling/v1 Scale) subresources;
- label and field selectors on list and watch; watch from a resourceVersion (history replay,
  410 Expired when too old), timeoutSeconds, streaming lists (sendInitialEvents with the
  initial-events-end bookmark kubectl wait needs), `application/json` streams;
- `/api/v1/namespaces` (KMock's path parser fails there), namespaced creates into a missing
  namespace are 404; standard Status reasons (NotFound, AlreadyExists, Conflict, Invalid, ...);
- finalizers and deletionTimestamp; ownerReference cascade (background) on delete;
- CustomResourceDefinitions register their resources in discovery when created; custom
  resources are pruned, defaulted and validated against the CRD's openAPIV3Schema (422);
- server-side Table output (kubectl's printer columns, Name and Age by default);
- a few built-in defaults (Deployment strategy/replicas, Service type, pod template fields);
- `/openapi/v3` and one OpenAPI v3 document per custom group/version, from the CRD schemas;
- RBAC: requests with a token listed in `rbac` get 403 Forbidden unless its rules grant the
  verb on the resource (the tests give the operator the Helm chart's ClusterRole).

What a real API server still does differently:
- no CEL (`x-kubernetes-validations`): a rule-breaking spec gets in and the operator reports it
  as Degraded; validation wording is openapi-schema-validator's; built-in kinds are not
  validated; no admission webhooks or quotas; no authentication: RBAC rules are enforced only
  on the tokens given in `rbac` (the operator's, with the Helm chart's ClusterRole), every
  other token may do anything; non-resource URLs (discovery) are open to all;
- strategic merge patch replaces lists instead of merging them by key; server-side apply is
  415 and there are no managedFields; dryRun, fieldValidation and fieldManager are ignored;
- no controllers: Deployments get no status, ReplicaSets or Pods (tests/e2e's kubelet plays
  that part); deleting a namespace or a CRD leaves what is in it; garbage collection is
  immediate and background only; deletion grace periods are 0;
- no pagination (limit/continue) or resourceVersionMatch; bookmarks only for streaming lists;
  a 4096-event watch history; no Table output on watches; built-in kinds print Name and Age;
- no protobuf; OpenAPI v3 documents only for custom resources (`kubectl explain spd` works;
  built-in kinds have none, and kubectl apply needs --validate=false); no OpenAPI v2; no
  aggregated discovery v2; no conversion between CRD versions; generation is
  kept only for custom resources and apps/*.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock

from kube import chart, objects, views
from kube.catalog import BUILTIN_KINDS, Kind, apply_builtin_defaults, kinds_from_crd
from kube.routing import (
    Route,
    body_json,
    error,
    header,
    json_patch,
    parse_route,
    selector_filter,
)
from kube.schema import Invalid, admit

Obj = dict[str, Any]
HISTORY = 4096
"""Watch events kept for resuming a watch from a resourceVersion; older ones are 410 Expired."""
_SERVING: contextvars.ContextVar[kmock.Request | None] = contextvars.ContextVar(
    "serving", default=None
)
"""The request being served in this task (see `RealisticKubernetes.__iter__`)."""


@dataclass(eq=False)
class _Watch:
    group: str
    plural: str
    accepts: Callable[[Obj], bool]
    queue: asyncio.Queue[Obj | None]


@attrs.define(kw_only=True)
class RealisticKubernetes(kmock.KubernetesScaffold):
    kinds: dict[tuple[str, str, str], Kind] = attrs.field(factory=dict, init=False)
    store: dict[tuple[str, str, str, str], Obj] = attrs.field(factory=dict, init=False)
    _history: collections.deque[tuple[int, str, str, Obj]] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY), init=False
    )
    _watches: list[_Watch] = attrs.field(factory=list, init=False)
    _rv: int = attrs.field(default=1000, init=False)
    rbac: dict[str, list[Obj]] = attrs.field(factory=dict)
    """Bearer token -> RBAC rules enforced on its requests; other tokens may do anything."""
    denials: list[str] = attrs.field(factory=list, init=False)
    """Every request refused by `rbac`, as 'verb group/resource', for the tests to assert on."""
    grants: list[str] = attrs.field(factory=list, init=False)
    """Every request `rbac` let through, as 'verb group/resource' (what the account used)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[re.compile(r"/api/v1/.+|/apis/[^/]+/[^/]+/.+")] << self._serve
        self.fallback[re.compile(r"/openapi/v3(/.*)?")] << self._serve_openapi
        for kind in BUILTIN_KINDS:
            self.register(kind)
        for name in ("default", "kube-system"):
            self.put_object(self.kinds["", "v1", "namespaces"], None, {"metadata": {"name": name}})

    # ----- registry and direct access (the fixture and CRD writes use these) -----

    def register(self, kind: Kind) -> None:
        self.kinds[kind.group, kind.version, kind.plural] = kind
        subresources = {name for name, on in (("status", kind.status), ("scale", kind.scale)) if on}
        verbs = {"create", "delete", "get", "list", "patch", "update", "watch"}
        self.resources[kmock.resource(kind.group, kind.version, kind.plural)] = kmock.ResourceInfo(
            kind=kind.kind, singular=kind.singular, namespaced=kind.namespaced, verbs=verbs,
            shortnames=set(kind.short_names), subresources=subresources,
        )  # fmt: skip

    def put_object(self, kind: Kind, namespace: str | None, body: Obj) -> Obj:
        """Create as a POST would (validation, defaults, watch event); raises KubernetesError."""
        return self._create(kind, namespace, copy.deepcopy(body))

    def close_watches(self) -> None:
        for watch in self._watches:
            watch.queue.put_nowait(None)

    # ----- HTTP entry points -----

    def __iter__(self) -> Iterator[kmock.Request]:
        """While a request is served, the request log reads as that request alone. KMock decides
        whether a reaction matches by looking for the request in the reaction's filtered view
        of the whole log, on every request for every reaction: O(log) per request, which made
        the server slower with each request it served (on a loaded 2-core host, GETs took 0.10 s
        each on average over the first 500 and 0.27 s from the 1,000th to the 1,500th; with
        this, 0.005 to 0.012 s throughout), until a test with 20 objects timed out. Filters are
        per-request criteria, so they decide the same; a reaction on a slice of the history
        (`kube[...][:1]`) does not count past requests here: a criterion that counts does
        (kube/faults.py). Outside serving (a test's assertions) the whole log is there."""
        serving = _SERVING.get()
        if serving is None:
            yield from super().__iter__()
        else:
            yield serving

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        token = _SERVING.set(request)
        try:
            return await super()._handle(request)
        finally:
            _SERVING.reset(token)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.rstrip("/") != "/api/v1/namespaces":
            return await super().__call__(raw_request)
        # KMock's path parser raises on exactly this path: describe the request ourselves.
        body = await raw_request.read()
        request = kmock.Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url,
            method=raw_request.method, params=dict(raw_request.query),
            headers=dict(raw_request.headers), body=body, text=body.decode(errors="replace"),
            resource=kmock.resource("", "v1", "namespaces"),
        )  # fmt: skip
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as exc:  # rendered as a Status, like every other failure
            return await self._rendererror(exc)

    async def _rendererror(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesNotFoundError):  # KMock's own, non-standard reasons
            exc = error(404, "NotFound", "the server could not find the requested resource")
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                 "code": exc.status, "reason": exc.reason, "message": exc.message,
                 "details": exc.details or {}},
                status=exc.status,
            )  # fmt: skip
        return await super()._rendererror(exc)

    async def _serve_server_version(self, request: kmock.Request) -> kmock.Payload:
        return {"major": "1", "minor": "35", "gitVersion": "v1.35.0-kmock", "platform": "linux"}

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        # KMock repeats short names and every verb on subresources; kubectl then refuses them.
        route = request.url.path.strip("/").split("/")
        group, version = ("", route[1]) if route[0] == "api" else (route[1], route[2])
        kinds = [k for k in self.kinds.values() if (k.group, k.version) == (group, version)]
        if not kinds:
            raise error(404, "NotFound", "the server could not find the requested resource")
        return views.api_resource_list(kinds)

    async def _serve_openapi(self, request: kmock.Request) -> kmock.Response:
        kinds = list(self.kinds.values())
        route = request.url.path.strip("/").split("/")  # openapi, v3, apis, group, version
        if len(route) == 2:
            return kmock.Response(status=200, payload=views.openapi_v3_index(kinds))
        if len(route) == 5 and route[2] == "apis":
            same = [k for k in kinds if (k.group, k.version) == (route[3], route[4]) and k.schema]
            if same:
                return kmock.Response(status=200, payload=views.openapi_v3_document(same))
        raise error(404, "NotFound", "the server could not find the requested resource")

    async def _serve(self, request: kmock.Request) -> kmock.Response:
        # KMock copies a returned Response's status into its reaction for good: always
        # return one, with the status of this very answer.
        self._authorize(request)
        answer = self._route(request)
        if isinstance(answer, kmock.Response):
            return answer
        return kmock.Response(status=200, payload=answer)

    def _authorize(self, request: kmock.Request) -> None:
        """403 Forbidden, as RBAC answers, when the token's rules do not grant the request."""
        token = header(request, "Authorization").removeprefix("Bearer ").strip()
        rules = self.rbac.get(token)
        route = parse_route(request.url.path)
        if rules is None or route is None:
            return
        method = str(request.method.value).upper()
        if method == "GET":
            watching = request.params.get("watch") in ("true", "1")
            verb = "watch" if watching else "get" if route.name else "list"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
            if method == "DELETE":
                verb = "delete" if route.name else "deletecollection"
        resource = f"{route.plural}/{route.sub}" if route.sub else route.plural
        if chart.allows(rules, verb, route.group, resource):
            self.grants.append(f"{verb} {route.group}/{resource}")
            return
        self.denials.append(f"{verb} {route.group}/{resource}")
        where = f' in the namespace "{route.namespace}"' if route.namespace else ""
        raise error(
            403,
            "Forbidden",
            f'{resource} is forbidden: User "{token}" cannot {verb} resource "{resource}" in '
            f'API group "{route.group}"{where}',
        )

    def _route(self, request: kmock.Request) -> kmock.Payload:
        route = parse_route(request.url.path)
        kind = route and self.kinds.get((route.group, route.version, route.plural))
        if route is None or kind is None:
            raise error(404, "NotFound", "the server could not find the requested resource")
        method, params = str(request.method.value).upper(), request.params
        if kind.namespaced is False and route.namespace is not None:
            raise error(404, "NotFound", f"{kind.qualified} is not namespaced")
        table = "as=Table" in header(request, "Accept")
        if method == "GET" and params.get("watch") in ("true", "1"):
            return self._watch(kind, route, params)
        if method == "GET" and route.name is None:
            items = self._select(kind, route.namespace, params)
            if table:
                return self._table(kind, items)
            meta = {"resourceVersion": str(self._rv)}
            return {"apiVersion": kind.api_version, "kind": f"{kind.kind}List",
                    "metadata": meta, "items": items}  # fmt: skip
        if method == "POST" and route.name is None:
            obj = self._create(kind, route.namespace, body_json(request))
            return kmock.Response(status=201, payload=obj)
        if route.name is None:
            raise error(405, "MethodNotAllowed", f"{method} is not supported on collections")
        current = self._find(kind, route.namespace, route.name)
        if method == "GET":
            if route.sub == "scale":
                return self._scale(kind, current)
            return self._table(kind, [current]) if table else copy.deepcopy(current)
        if method == "DELETE":
            data = body_json(request, default={})
            return self._delete(kind, current, orphan=data.get("propagationPolicy") == "Orphan")
        if method in ("PUT", "PATCH"):
            body = body_json(request)
            content_type = header(request, "Content-Type")
            if method == "PUT":
                edit: Callable[[Obj], Obj] = lambda _old: body  # noqa: E731
            elif "json-patch" in content_type:
                edit = lambda old: json_patch(old, body)  # noqa: E731
            elif "merge-patch" in content_type:  # merge and strategic merge
                edit = lambda old: objects.merge_patch(old, body)  # noqa: E731
            else:
                raise error(415, "UnsupportedMediaType", f"unsupported patch: {content_type}")
            if route.sub == "scale":
                return self._scale(kind, self._rescale(kind, current, edit))
            return self._update(kind, current, edit, route.sub)
        raise error(405, "MethodNotAllowed", f"{method} is not supported")

    # ----- the store -----

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (kind.group, kind.plural, namespace or "", name)

    def _find(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        found = self.store.get(self._key(kind, namespace, name))
        if found is None:
            raise error(404, "NotFound", f'{kind.qualified} "{name}" not found',
                         name=name, group=kind.group, kind=kind.plural)  # fmt: skip
        return found

    def _select(self, kind: Kind, namespace: str | None, params: Mapping[str, str]) -> list[Obj]:
        accepts = selector_filter(namespace, params)
        found = [
            copy.deepcopy(obj)
            for (group, plural, _, _), obj in sorted(self.store.items())
            if (group, plural) == (kind.group, kind.plural) and accepts(obj)
        ]
        return found

    def _emit(self, kind: Kind, event_type: str, obj: Obj) -> None:
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        self._history.append((self._rv, kind.group, kind.plural, event))
        for watch in self._watches:
            if (watch.group, watch.plural) == (kind.group, kind.plural) and watch.accepts(obj):
                watch.queue.put_nowait(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _admit(self, kind: Kind, obj: Obj) -> Obj:
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if kind.schema is not None:
            try:
                return admit(f"{kind.kind}.{kind.group}", obj["metadata"]["name"], kind.schema, obj)
            except Invalid as exc:
                raise error(
                    422,
                    "Invalid",
                    str(exc),
                    name=obj["metadata"]["name"],
                    group=kind.group,
                    kind=kind.kind,
                    causes=exc.causes,
                ) from None
        apply_builtin_defaults(kind, obj)
        return obj

    def _create(self, kind: Kind, namespace: str | None, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if namespace and meta.get("namespace", namespace) != namespace:
                raise error(400, "BadRequest", "the namespace of the provided object does not "
                             "match the namespace sent on the request")  # fmt: skip
            namespace = namespace or meta.get("namespace") or "default"
            if ("", "namespaces", "", namespace) not in self.store:
                raise error(404, "NotFound", f'namespaces "{namespace}" not found')
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise error(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value")
        key = self._key(kind, namespace, meta["name"])
        if key in self.store:
            raise error(409, "AlreadyExists", f'{kind.qualified} "{meta["name"]}" already exists',
                         name=meta["name"], group=kind.group, kind=kind.plural)  # fmt: skip
        for server_owned in ("deletionTimestamp", "resourceVersion", "uid", "generation"):
            meta.pop(server_owned, None)
        if kind.status:
            obj.pop("status", None)
        obj = self._admit(kind, obj)
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=objects.now_rfc3339())
        if kind.tracks_generation:
            meta["generation"] = 1
        if kind.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        if kind.kind == "CustomResourceDefinition":
            self._register_crd(obj)
        meta["resourceVersion"] = self._next_rv()
        self.store[key] = obj
        self._emit(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    def _update(self, kind: Kind, old: Obj, edit: Callable[[Obj], Obj], sub: str | None) -> Obj:
        new = edit(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise error(400, "BadRequest", "the body must be an object")
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise error(409, "Conflict", f'Operation cannot be fulfilled on {kind.qualified} '
                         f'"{old["metadata"]["name"]}": the object has been modified; please '
                         "apply your changes to the latest version and try again")  # fmt: skip
        if sub == "status":  # only status changes through /status
            status, new = new.get("status"), copy.deepcopy(old)
            new.pop("status", None)
            if status is not None:
                new["status"] = status
        elif kind.status:  # and never through the main endpoint
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        meta = new.setdefault("metadata", {})
        for server_owned in ("uid", "creationTimestamp", "namespace", "name", "generation",
                             "resourceVersion", "deletionTimestamp"):  # fmt: skip
            meta.pop(server_owned, None)
            if server_owned in old["metadata"]:
                meta[server_owned] = old["metadata"][server_owned]
        new = self._admit(kind, new)
        if new == old:
            return copy.deepcopy(old)  # a no-op write changes nothing, not even resourceVersion
        if kind.tracks_generation and _spec_of(new, kind) != _spec_of(old, kind):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if kind.kind == "CustomResourceDefinition":
            self._register_crd(new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        key = self._key(kind, meta.get("namespace"), meta["name"])
        self.store[key] = new
        self._emit(kind, "MODIFIED", new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._remove(kind, new, orphan=False)
        return copy.deepcopy(new)

    def _delete(self, kind: Kind, obj: Obj, *, orphan: bool) -> Obj:
        meta = obj["metadata"]
        if not meta.get("finalizers"):
            return self._remove(kind, obj, orphan=orphan)
        if not meta.get("deletionTimestamp"):  # finalizers hold it: mark, let them finish
            meta.update(deletionTimestamp=objects.now_rfc3339(), deletionGracePeriodSeconds=0)
            meta["resourceVersion"] = self._next_rv()
            self._emit(kind, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def _remove(self, kind: Kind, obj: Obj, *, orphan: bool) -> Obj:
        meta = obj["metadata"]
        self.store.pop(self._key(kind, meta.get("namespace"), meta["name"]), None)
        meta["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", obj)
        if not orphan:  # the garbage collector's background cascade over ownerReferences
            for key, child in list(self.store.items()):
                owners = child["metadata"].get("ownerReferences", [])
                if key in self.store and any(o.get("uid") == meta["uid"] for o in owners):
                    child_kind = self._kind_of(key[0], key[1])
                    self._delete(child_kind, child, orphan=False)
        return copy.deepcopy(obj)

    def _kind_of(self, group: str, plural: str) -> Kind:
        return next(k for k in self.kinds.values() if (k.group, k.plural) == (group, plural))

    def _register_crd(self, crd: Obj) -> None:
        for kind in kinds_from_crd(crd):
            self.register(kind)
        names = crd["spec"]["names"]
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m,
                 "lastTransitionTime": objects.now_rfc3339()}
                for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                ("Established", "InitialNamesAccepted", "the initial names "
                                 "have been accepted"))
            ],
        }  # fmt: skip

    # ----- subresources and views -----

    def _scale(self, kind: Kind, obj: Obj) -> Obj:
        if not kind.scale:
            raise error(404, "NotFound", f"{kind.qualified} has no scale subresource")
        return views.scale(kind.scale, obj)

    def _rescale(self, kind: Kind, obj: Obj, edit: Callable[[Obj], Obj]) -> Obj:
        scale = edit(self._scale(kind, obj))
        replicas = objects.get_path(scale, "spec.replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise error(422, "Invalid", f"Scale is invalid: spec.replicas: {replicas!r}")
        spec_path = kind.scale["specReplicasPath"] if kind.scale else ""

        def set_replicas(current: Obj) -> Obj:
            objects.set_path(current, spec_path, replicas)
            return current

        return self._update(kind, obj, set_replicas, None)

    def _table(self, kind: Kind, items: list[Obj]) -> Obj:
        return views.table(kind.columns, items, self._rv)

    def _watch(self, kind: Kind, route: Route, params: Mapping[str, str]) -> kmock.Response:
        accepts = selector_filter(route.namespace, params, route.name)
        since = params.get("resourceVersion", "")
        if since in ("", "0"):  # start now, with a synthetic ADDED for everything that exists
            backlog = [{"type": "ADDED", "object": o} for o in self._select(kind, None, {})]
            backlog = [e for e in backlog if accepts(e["object"])]
        elif self._history and int(since) < self._history[0][0] - 1:
            gone = {
                "apiVersion": "v1",
                "kind": "Status",
                "status": "Failure",
                "code": 410,
                "reason": "Expired",
                "message": f"too old resource version: {since}",
            }
            backlog = [{"type": "ERROR", "object": gone}]  # fmt: skip
        else:
            backlog = [
                copy.deepcopy(event)
                for rv, group, plural, event in self._history
                if rv > int(since) and (group, plural) == (kind.group, kind.plural)
                and accepts(event["object"])
            ]  # fmt: skip
        if params.get("sendInitialEvents") == "true":  # a streaming list (client-go WatchList)
            backlog = [{"type": "ADDED", "object": o} for o in self._select(kind, None, {})]
            backlog = [e for e in backlog if accepts(e["object"])]
            end = {"resourceVersion": str(self._rv),
                   "annotations": {"k8s.io/initial-events-end": "true"}}  # fmt: skip
            bookmark = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": end}
            backlog.append({"type": "BOOKMARK", "object": bookmark})
        watch = _Watch(kind.group, kind.plural, accepts, asyncio.Queue())
        self._watches.append(watch)
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None

        async def stream() -> AsyncIterator[Any]:
            try:
                yield b""  # send the headers now: clients wait for them before reading
                for event in backlog:
                    yield event
                deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
                while True:
                    left = (
                        None if deadline is None else deadline - asyncio.get_running_loop().time()
                    )
                    try:
                        event = await asyncio.wait_for(watch.queue.get(), left)
                    except TimeoutError:
                        return
                    if event is None:
                        return
                    yield event
            finally:
                self._watches.remove(watch)

        json_type = {"Content-Type": "application/json"}
        return kmock.Response(status=200, headers=json_type, payload=stream())


def _spec_of(obj: Obj, kind: Kind) -> Obj:
    """What generation tracks: everything but metadata (and status, where it is separate)."""
    skip = {"metadata", "status"} if kind.status else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}
