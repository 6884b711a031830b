"""Hypothesis strategies for whole SpecDeployment specs, valid and invalid, with hostile strings.

`specs()` draws a spec over every top-level field (engine, model, image, command,
servedModelName, port, replicas, resources, extraArgs, env, speculative, tuning, pod); most
draws are meant to be admitted, some break a rule (a bound, an enum, a cross-field rule).
`mutated(specs())` then replaces, deletes or adds one key anywhere in it with JSON junk, the
slips a YAML author makes. `HOSTILE` are strings a shell or a YAML/JSON writer would trip on:
metacharacters, quotes, newlines, 10 kB values, non-ASCII; the CRD admits most of them where a
field takes free text (extraArgs, env values, command), and they must reach the pod unchanged.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from specpilot.operator.api.speculative import CANDIDATE_METHODS
from specpilot.runtime.engines import ADAPTERS
from specpilot.tuner import GPUS, PROFILES

Obj = dict[str, Any]

HOSTILE_TEXTS = (
    "$(touch /tmp/pwned)",
    "`id`; rm -rf / #",
    "a && b || c | d > /etc/passwd < x",
    "'\"\\ \t*?[]{}~!",
    "line one\nline two\r\n",
    "${HF_TOKEN}",
    "--port=1",
    "-",
    "--",
    "ünïcødé ✓ 模型",
    "x" * 10_240,
    "$(printf '%s' " + "y" * 10_000 + ")",
    "",
)
"""Free text as a hostile or careless author writes it (a 10 kB value among them)."""
HOSTILE = st.sampled_from(HOSTILE_TEXTS) | st.text(max_size=40)
MODEL_NAMES = st.sampled_from(
    ["meta-llama/Llama-3.1-8B-Instruct", "/models/my model; $(reboot)", "org/m`id`el", "m" * 1024,
     "ok/ünï", "a'b\"c"]
)  # fmt: skip
BAD_MODEL_NAMES = st.sampled_from(
    ["m" * 1025, "-rf", "bad\nname", ""]  # too long, a flag, a control character, empty
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | HOSTILE,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _pick(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """Mostly `good`; one time in 12 `bad` (a spec has about ten such choices: about half of
    the specs drawn are admitted)."""
    return (
        draw(bad) if draw(st.integers(0, 11)) == 7 else draw(good)
    )  # not 0 or 11: hypothesis favours the bounds


def _opt(draw: st.DrawFn, strategy: st.SearchStrategy[Any], odds: int = 3) -> Any:
    """A value one time in `odds`, else None (the key is then left out)."""
    return draw(strategy) if draw(st.integers(0, odds - 1)) == 0 else None


@st.composite
def _candidate(draw: st.DrawFn, method: str) -> Obj:
    out: Obj = {"method": method}
    if draw(st.integers(0, 3)) == 0:
        out["k"] = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True))
    else:
        out["maxK"] = draw(st.integers(1, 8))
        if draw(st.booleans()):
            out["minK"] = draw(st.integers(1, out["maxK"]))
    needs = method in ("draft_model", "eagle", "eagle3", "dflash")
    if needs or (method == "mtp" and draw(st.booleans())):
        out["draftModel"] = draw(st.sampled_from(["org/draft", "/drafts/d $(x)", "d\u00e9"]))
    if draw(st.integers(0, 4)) == 0:
        options: Obj = {}
        if method == "ngram" and draw(st.booleans()):
            low = draw(st.integers(1, 4))
            options = {"promptLookupMin": low, "promptLookupMax": draw(st.integers(low, 8))}
        if method not in ("suffix", "dflash") and draw(st.booleans()):
            options["eagleTopk"] = draw(st.integers(2, 4))
            options["numDraftTokens"] = draw(st.integers(2, options["eagleTopk"] + 1))
        out["options"] = options
    return out


@st.composite
def _speculative(draw: st.DrawFn) -> Obj:
    methods = draw(
        st.lists(st.sampled_from(CANDIDATE_METHODS), min_size=1, max_size=3, unique=True)
    )
    out: Obj = {"candidates": [draw(_candidate(m)) for m in methods]}
    if draw(st.booleans()):
        out["allowOff"] = draw(st.booleans())
    if draw(st.integers(0, 2)) == 0:
        method = draw(st.sampled_from(["none", *methods]))
        out["initial"] = {"method": method} if method == "none" else {"method": method, "k": 1}
    return out


@st.composite
def _env(draw: st.DrawFn) -> list[Obj]:
    names = draw(
        st.lists(
            st.sampled_from(["A", "HF_TOKEN", "PATH", "X_1", "HF_HOME"]), max_size=3, unique=True
        )
    )
    out: list[Obj] = []
    for name in names:
        if draw(st.integers(0, 2)) == 0:
            ref = {"name": draw(st.sampled_from(["hf-token", "creds"])), "key": "token"}
            kind = draw(st.sampled_from(["secretKeyRef", "configMapKeyRef"]))
            out.append({"name": name, "valueFrom": {kind: ref}})
        else:
            out.append({"name": name, "value": draw(HOSTILE | st.just("v" * 32_768))})
    return out


@st.composite
def _tuning(draw: st.DrawFn) -> Obj:
    out: Obj = {}
    for key, strategy in (
        ("mode", st.sampled_from(["auto", "recommend", "off"])),
        ("objective", st.sampled_from(["latency", "throughput", "goodput"])),
        ("intervalSeconds", st.integers(5, 3600)),
        ("minDwellSeconds", st.integers(0, 1000)),
        ("restartBudgetPerHour", st.integers(0, 60)),
        ("rolloutTimeoutSeconds", st.integers(30, 7200)),
        ("canary", st.booleans()),
        ("explore", st.booleans()),
        ("maxSurge", st.integers(1, 2)),
        ("maxUnavailable", st.integers(0, 2)),
        (
            "slo",
            st.fixed_dictionaries(
                {}, optional={"tpotP95Ms": st.floats(1, 200), "ttftP95Ms": st.floats(10, 5000)}
            ),
        ),
    ):
        value = _opt(draw, strategy)
        if value is not None:
            out[key] = value
    if draw(st.integers(0, 3)) == 0:
        url = _pick(
            draw,
            st.sampled_from(["http://prometheus.monitoring:9090", "https://p.example/prom?x=$(y)"]),
            st.sampled_from(["http://", "http://u:p@h", "http://h/\n"]) | HOSTILE,
        )
        out["metrics"] = {
            "source": draw(st.sampled_from(["scrape", "prometheus"])),
            "prometheusUrl": url,
        }
    return out


@st.composite
def _pod(draw: st.DrawFn) -> Obj:
    out: Obj = {}
    if draw(st.booleans()):
        out["labels"] = {"team": draw(st.sampled_from(["ml", "x" * 63]))}
    if draw(st.booleans()):
        out["annotations"] = {"note": draw(HOSTILE)}
    if draw(st.booleans()):
        out["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if draw(st.booleans()):
        out["shmSize"] = draw(st.sampled_from(["16Gi", "1.5G"]))
    if draw(st.booleans()):
        out["modelCache"] = draw(
            st.sampled_from(
                [{}, {"sizeLimit": "100Gi"}, {"claimName": "weights", "readOnly": True}]
            )
        )
    if draw(st.booleans()):
        out["containerSecurityContext"] = {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    return out


@st.composite
def specs(draw: st.DrawFn) -> Obj:
    """A whole spec; about half admitted."""
    spec: Obj = {
        "engine": draw(st.sampled_from(list(ADAPTERS))),
        "model": _pick(draw, MODEL_NAMES, BAD_MODEL_NAMES),
    }
    optional: list[tuple[str, st.SearchStrategy[Any], st.SearchStrategy[Any]]] = [
        (
            "image",
            st.sampled_from(["vllm/vllm-openai:v0.32.0", "reg.io/x:1"]),
            st.sampled_from(["has space", ""]),
        ),
        (
            "command",
            st.lists(HOSTILE, min_size=1, max_size=3),
            st.just([]) | st.lists(st.just("--port"), min_size=1),
        ),
        (
            "servedModelName",
            st.sampled_from(["llama", "my model $(x)"]),
            st.sampled_from(["n\nl", ""]),
        ),
        ("port", st.integers(1, 65535), st.sampled_from([0, 65536])),
        ("replicas", st.integers(0, 4), st.just(-1)),
        ("resources", _resources(good=True), _resources(good=False)),
        (
            "extraArgs",
            st.lists(
                HOSTILE
                | st.sampled_from(["--max-model-len", "4096", "--chat-template", "--hostname"]),
                max_size=5,
            ),
            st.lists(
                st.sampled_from(["--por", "--spec-tokens=3", "x" * 4097]), min_size=1, max_size=2
            ),
        ),
        ("env", _env(), st.just([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])),
        ("speculative", _speculative(), _speculative().map(lambda s: {**s, "candidates": []})),
        ("tuning", _tuning(), st.just({"objective": "goodput"}) | st.just({"intervalSeconds": 1})),
        ("pod", _pod(), st.just({"labels": {"team": "a b"}}) | st.just({"shmSize": "lots"})),
    ]
    for key, good, bad in optional:
        if draw(st.booleans()):
            spec[key] = _pick(draw, good, bad)
    return spec


@st.composite
def _resources(draw: st.DrawFn, good: bool) -> Obj:
    if not good:
        return draw(
            st.sampled_from(
                [{"gpus": 17}, {"gpuType": "T4"}, {"modelProfile": "gpt-5"}, {"cpu": "eight"},
                 {"memory": "64 Gi"}, {"extra": {"cpu": "1"}}, {"extra": {"bad key!": "1"}}]
            )
        )  # fmt: skip
    return draw(
        st.fixed_dictionaries(
            {},
            optional={
                "gpus": st.integers(0, 16),
                "gpuType": st.sampled_from(list(GPUS)),
                "modelProfile": st.sampled_from(list(PROFILES)),
                "cpu": st.sampled_from(["8", "500m"]),
                "memory": st.sampled_from(["64Gi", "1.5G"]),
                "nodeSelector": st.dictionaries(
                    st.sampled_from(["gpu", "zone"]), HOSTILE, max_size=2
                ),
                "extra": st.dictionaries(
                    st.sampled_from(["rdma/ib", "ephemeral-storage"]), st.just("1"), max_size=2
                ),
            },
        )
    )


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside `value` (dict keys and list indexes)."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*path, index))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Obj]) -> Obj:
    """`base` with one slip: a value replaced by junk, a key deleted, or an unknown key added."""
    import copy

    spec = copy.deepcopy(draw(base))
    path = draw(st.sampled_from(_paths(spec)[1:]))
    parent: Any = spec
    for part in path[:-1]:
        parent = parent[part]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(JSON)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.sampled_from(["extra", "Model", "maxk", "value"]))] = draw(JSON)
    else:
        parent.append(draw(JSON))
    return spec
