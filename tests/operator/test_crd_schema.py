"""The SpecDeployment CRD, offline: structure, defaults, examples, and a corpus of valid and
invalid objects judged both by the CRD (schema + CEL, as the API server would) and by
`decode_spec`, which must agree with it."""

from __future__ import annotations

import copy
from pathlib import Path
from types import MappingProxyType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import (
    ROOT,
    Failure,
    admit,
    apply_defaults,
    cel_rules,
    load_crd,
    prune_unknown_fields,
    root_schema,
    strip_indexes,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.operator.api.spec import (
    CANDIDATE_METHODS,
    DEFAULT_IMAGES,
    METRICS_SOURCES,
    OBJECTIVES,
    TUNING_MODES,
    GpuSpec,
    SpecDeploymentSpec,
    SpecError,
    TuningSpec,
    config_from_status,
    config_to_status,
    decode_spec,
)
from specpilot.runtime.engines import ADAPTERS
from specpilot.tuner import GPUS, PROFILES, SpecConfig

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _sub(*path: str) -> dict[str, Any]:
    node: dict[str, Any] = root_schema()
    for key in path:
        node = node["items"] if key == "[]" else node["properties"][key]
    return node


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for key, sub in (schema.get("properties") or {}).items():
        out += _walk(sub, f"{path}.{key}")
    if "items" in schema:
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def spd(spec: dict[str, Any], name: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


BASE: dict[str, Any] = {
    "engine": "vllm",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "speculative": {"candidates": [{"method": "eagle3", "maxK": 4, "draftModel": "d/eagle3"}]},
}


def with_(patch: dict[str, Any]) -> dict[str, Any]:
    """BASE with top-level keys replaced."""
    spec = copy.deepcopy(BASE)
    spec.update(copy.deepcopy(patch))
    return spec


# --- the CRD's own shape -------------------------------------------------------------------


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(load_crd(), "1.35.0", strict=True)


def test_schema_is_structural_and_documented() -> None:
    for path, node in _walk(root_schema()):
        assert "type" in node, f"{path or '<root>'} has no type"
        # a list of plain values is described by the list
        plain_item = path.endswith("[]") and node["type"] in ("string", "integer", "number")
        assert plain_item or node.get("description"), f"{path or '<root>'} has no description"
        # only the deep parts of Kubernetes core types under spec.pod are kept as written
        if node.get("x-kubernetes-preserve-unknown-fields") is True:
            assert path.startswith(".spec.pod."), path
        for rule in node.get("x-kubernetes-validations", []):
            assert rule.get("message"), f"a rule at {path} has no message"


def test_every_cel_rule_compiles() -> None:
    import celpy

    env = celpy.Environment()
    rules = list(cel_rules(root_schema()))
    assert len(rules) >= 20
    for rule in rules:
        env.compile(rule)


def test_names_subresources_and_printer_columns() -> None:
    crd = load_crd()
    assert crd["spec"]["group"] == "specpilot.io"
    assert crd["spec"]["names"]["shortNames"] == ["spd"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Engine", "Method", "K", "Regime", "AccLen", "Batch", "Ready", "Replicas", "Phase",
        "Age", "URL",
    ]  # fmt: skip
    for column in version["additionalPrinterColumns"]:
        if column["name"] == "Age":
            continue
        # the column reads a declared field (a filter reads the items of a declared list)
        path = column["jsonPath"].replace('[?(@.type=="Ready")]', ".[]")
        _sub(*path.lstrip(".").split("."))
    (ready,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "Ready"]
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    conditions = _sub("status", "conditions", "[]")
    assert set(conditions["required"]) == {
        "type", "status", "reason", "message", "lastTransitionTime",
    }  # fmt: skip


def test_enums_match_the_code() -> None:
    assert _sub("spec", "engine")["enum"] == list(ADAPTERS)
    assert _sub("spec", "resources", "gpuType")["enum"] == list(GPUS)
    assert _sub("spec", "resources", "modelProfile")["enum"] == list(PROFILES)
    method = _sub("spec", "speculative", "candidates", "[]", "method")
    assert tuple(method["enum"]) == CANDIDATE_METHODS
    assert _sub("spec", "speculative", "initial", "method")["enum"] == ["none", *CANDIDATE_METHODS]
    tuning = _sub("spec", "tuning")["properties"]
    assert tuple(tuning["mode"]["enum"]) == TUNING_MODES
    assert tuple(tuning["objective"]["enum"]) == OBJECTIVES
    assert tuple(tuning["metrics"]["properties"]["source"]["enum"]) == METRICS_SOURCES


def test_crd_defaults_equal_dataclass_defaults() -> None:
    spec, tuning, gpu = (
        SpecDeploymentSpec(engine="vllm", model="m", image="i"),
        TuningSpec(),
        GpuSpec(),
    )
    table: list[tuple[tuple[str, ...], object]] = [
        (("spec", "port"), spec.port),
        (("spec", "resources", "gpus"), gpu.count),
        (("spec", "resources", "gpuType"), gpu.type),
        (("spec", "speculative", "allowOff"), spec.allow_off),
        (("spec", "tuning", "mode"), tuning.mode),
        (("spec", "tuning", "objective"), tuning.objective),
        (("spec", "tuning", "intervalSeconds"), tuning.interval_s),
        (("spec", "tuning", "minDwellSeconds"), tuning.min_dwell_s),
        (("spec", "tuning", "restartBudgetPerHour"), tuning.restart_budget_per_hour),
        (("spec", "tuning", "rolloutTimeoutSeconds"), tuning.rollout_timeout_s),
        (("spec", "tuning", "canary"), tuning.canary),
        (("spec", "tuning", "explore"), tuning.explore),
        (("spec", "tuning", "maxSurge"), tuning.max_surge),
        (("spec", "tuning", "maxUnavailable"), tuning.max_unavailable),
        (("spec", "tuning", "metrics", "source"), tuning.metrics_source),
    ]
    for path, value in table:
        assert _sub(*path)["default"] == value, path
    # Every default in the CRD is in the table (or an empty object that carries defaults).
    defaulted = {
        p for p, node in _walk(root_schema()) if "default" in node and node["default"] != {}
    }
    assert defaulted == {"." + ".".join(p) for p, _ in table}


def test_unset_fields_decode_the_same_with_or_without_server_defaults() -> None:
    raw = {"engine": "sglang", "model": "Qwen/Qwen3-8B"}
    stored, failures = admit(spd(raw))
    assert failures == []
    assert stored["spec"]["tuning"]["metrics"] == {"source": "scrape"}
    assert decode_spec(raw) == decode_spec(stored["spec"])
    assert decode_spec(raw).image == DEFAULT_IMAGES["sglang"] == "lmsysorg/sglang:v0.5.23"
    assert decode_spec(raw).candidates == (SpecConfig(),)


def test_pruning_drops_unknown_fields_that_decode_spec_would_refuse() -> None:
    raw = with_({"replica": 3, "tuning": {"mode": "off", "speed": "max"}})
    stored, failures = admit(spd(raw))
    assert failures == []
    assert "replica" not in stored["spec"] and "speed" not in stored["spec"]["tuning"]
    assert decode_spec(stored["spec"]).tuning.mode == "off"
    with pytest.raises(SpecError) as err:
        decode_spec(raw)
    assert err.value.field == "spec.replica"


def test_pruning_and_defaulting_helpers_leave_their_input_alone() -> None:
    raw = spd(with_({"x": 1}))
    before = copy.deepcopy(raw)
    apply_defaults(prune_unknown_fields(raw, root_schema()), root_schema())
    assert raw == before


# --- examples ------------------------------------------------------------------------------


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "vllm-eagle3.yaml",
        "sglang-dflash.yaml",
        "recommend-only.yaml",
        "ngram-only.yaml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).name)
def test_example_is_admitted_and_decodes(path: Path) -> None:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    stored, failures = admit(obj)
    assert failures == []
    assert stored["spec"] == apply_defaults(obj["spec"], _sub("spec"))  # nothing pruned
    decoded = decode_spec(stored["spec"])
    assert decoded == decode_spec(obj["spec"])
    assert decoded.initial in decoded.candidates
    for config in decoded.candidates:
        ADAPTERS[decoded.engine].check(config)


# --- a table of invalid objects: the CRD and decode_spec reject them at the same field -----

CAND = "spec.speculative.candidates"
C0 = CAND + "[0]"
EAGLE = BASE["speculative"]["candidates"]


def cands(*candidates: dict[str, Any], engine: str = "vllm", **more: Any) -> dict[str, Any]:
    """A spec with these candidates (and further `speculative` keys)."""
    return with_({"engine": engine, "speculative": {"candidates": list(candidates), **more}})


def ngram(**fields: Any) -> dict[str, Any]:
    return {"method": "ngram", **fields}


def eagle3(**fields: Any) -> dict[str, Any]:
    return {"method": "eagle3", "draftModel": "d", **fields}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("eagle3 without draft", cands({"method": "eagle3", "maxK": 3}), C0 + ".draftModel"),
    ("dflash without draft", cands({"method": "dflash", "k": [15]}, engine="sglang"),
     C0 + ".draftModel"),
    ("ngram with draft", cands(ngram(maxK=3, draftModel="x")), C0 + ".draftModel"),
    ("suffix on sglang", cands({"method": "suffix", "maxK": 3}, engine="sglang"), CAND),
    ("tree on vllm", cands(eagle3(maxK=3, options={"eagleTopk": 4, "numDraftTokens": 8})), CAND),
    ("topk 1 on vllm", cands(ngram(maxK=3, options={"eagleTopk": 1})), CAND),
    ("prompt lookup on sglang",
     cands(ngram(maxK=3, options={"promptLookupMax": 4}), engine="sglang"), CAND),
    ("prompt lookup on eagle3", cands(eagle3(maxK=3, options={"promptLookupMax": 4})),
     C0 + ".options"),
    ("lookup min > max", cands(ngram(maxK=3, options={"promptLookupMin": 5, "promptLookupMax": 2})),
     C0 + ".options.promptLookupMin"),
    ("minK > maxK", cands(ngram(maxK=3, minK=4)), C0 + ".minK"),
    ("maxK and k", cands(ngram(maxK=3, k=[1])), C0 + ".maxK"),
    ("neither maxK nor k", cands(ngram()), C0 + ".maxK"),
    ("minK with k", cands(ngram(minK=1, k=[2])), C0 + ".minK"),
    ("tree too big", cands(eagle3(maxK=3, options={"eagleTopk": 2, "numDraftTokens": 6}),
                           engine="sglang"), C0 + ".options.numDraftTokens"),
    ("tree without topk", cands(eagle3(k=[3], options={"numDraftTokens": 4}), engine="sglang"),
     C0 + ".options.numDraftTokens"),
    ("initial not a candidate", cands(*EAGLE, initial={"method": "ngram", "k": 3}),
     "spec.speculative.initial.method"),
    ("initial K outside", cands(*EAGLE, initial={"method": "eagle3", "k": 9}),
     "spec.speculative.initial.k"),
    ("initial none without allowOff", cands(*EAGLE, allowOff=False, initial={"method": "none"}),
     "spec.speculative.initial.method"),
    ("initial none with k", cands(*EAGLE, initial={"method": "none", "k": 2}),
     "spec.speculative.initial.k"),
    ("speculative flag in extraArgs",
     with_({"extraArgs": ["--max-model-len", "4096", "--speculative-config", "{}"]}),
     "spec.extraArgs"),
    ("sglang speculative flag",
     with_({"engine": "sglang", "extraArgs": ["--speculative-num-steps=3"]}), "spec.extraArgs"),
    ("goodput without slo", with_({"tuning": {"objective": "goodput"}}), "spec.tuning.slo"),
    ("prometheus without url", with_({"tuning": {"metrics": {"source": "prometheus"}}}),
     "spec.tuning.metrics.prometheusUrl"),
    ("env value and valueFrom", with_({"env": [{"name": "A", "value": "1", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]}), "spec.env[0]"),
    ("duplicate method", cands(ngram(maxK=2), ngram(maxK=3)), CAND),
    ("unknown engine", with_({"engine": "trtllm"}), "spec.engine"),
    ("K too large", cands(ngram(maxK=17)), C0 + ".maxK"),
    ("negative replicas", with_({"replicas": -1}), "spec.replicas"),
    ("unknown gpu", with_({"resources": {"gpuType": "T4"}}), "spec.resources.gpuType"),
    ("unknown profile", with_({"resources": {"modelProfile": "gpt-5"}}),
     "spec.resources.modelProfile"),
    ("bad mode", with_({"tuning": {"mode": "yolo"}}), "spec.tuning.mode"),
    ("interval too short", with_({"tuning": {"intervalSeconds": 1}}),
     "spec.tuning.intervalSeconds"),
    ("no model", {"engine": "vllm"}, "spec"),
    # YAML slips: the wrong type gets a field error, never a traceback.
    ("replicas as text", with_({"replicas": "two"}), "spec.replicas"),
    ("extraArgs as one string", with_({"extraArgs": "--max-model-len 4096"}), "spec.extraArgs"),
    ("candidates as a map", with_({"speculative": {"candidates": {"method": "ngram"}}}),
     "spec.speculative.candidates"),
    ("maxK as text", cands(ngram(maxK="3")), C0 + ".maxK"),
    ("canary as text", with_({"tuning": {"canary": "yes"}}), "spec.tuning.canary"),
    ("explore as text", with_({"tuning": {"explore": "sometimes"}}), "spec.tuning.explore"),
    ("a rollout that cannot move", with_({"tuning": {"maxSurge": 0, "maxUnavailable": 0}}),
     "spec.tuning.maxSurge"),
    ("negative surge", with_({"tuning": {"maxSurge": -1}}), "spec.tuning.maxSurge"),
    ("env as a map", with_({"env": {"A": "1"}}), "spec.env"),
    # An empty string is not "unset": refused at admission, not stored and then Degraded.
    ("empty image", with_({"image": ""}), "spec.image"),
    ("empty servedModelName", with_({"servedModelName": ""}), "spec.servedModelName"),
    ("empty secret name", with_({"env": [{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "", "key": "k"}}}]}), "spec.env[0].valueFrom.secretKeyRef.name"),
]  # fmt: skip


def _same_field(crd_path: str, decoded_path: str) -> bool:
    a, b = strip_indexes(crd_path), strip_indexes(decoded_path)
    return a.startswith(b) or b.startswith(a)


@pytest.mark.parametrize(
    ("spec", "field"), [(s, f) for _, s, f in INVALID], ids=[i[0] for i in INVALID]
)
def test_invalid_is_rejected_by_crd_and_decoder_at_the_same_field(
    spec: dict[str, Any], field: str
) -> None:
    _, failures = admit(spd(spec))
    assert failures, "the CRD accepted it"
    assert any(_same_field(f.path, field) for f in failures), failures
    with pytest.raises(SpecError) as err:
        decode_spec(spec)
    assert _same_field(err.value.field, field), (err.value.field, field)
    message = str(err.value)
    assert err.value.field in message and "allowed" in message


def test_error_message_names_field_value_and_allowed() -> None:
    with pytest.raises(SpecError) as err:
        decode_spec(with_({"tuning": {"mode": "yolo"}}))
    assert (err.value.field, err.value.value) == ("spec.tuning.mode", "yolo")
    assert "auto | recommend | off" in str(err.value)


def test_unknown_field_names_the_known_ones() -> None:
    with pytest.raises(SpecError) as err:
        decode_spec(with_({"tuning": {"intervalSecond": 30}}))
    assert (err.value.field, err.value.value) == ("spec.tuning.intervalSecond", 30)
    assert "intervalSeconds" in err.value.allowed and "unknown field" in str(err.value)


def test_missing_field_says_what_it_is() -> None:
    with pytest.raises(SpecError) as err:
        decode_spec({"model": "m"})
    assert (err.value.field, err.value.allowed) == ("spec.engine", "vllm | sglang")
    assert "required: Inference engine" in str(err.value)


def test_duplicate_list_map_keys_name_the_second_entry() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    with pytest.raises(SpecError) as err:
        decode_spec(with_({"env": env}))
    assert (err.value.field, err.value.value) == ("spec.env[1].name", "A")


def test_nulls_are_unset_and_any_mapping_decodes() -> None:
    nulls = with_({"image": None, "replicas": None, "tuning": {"slo": None, "canary": None}})
    assert decode_spec(nulls) == decode_spec(BASE)
    assert decode_spec(MappingProxyType(copy.deepcopy(BASE))) == decode_spec(BASE)


def test_metadata_name_rule() -> None:
    assert admit(spd(BASE, name="a" * 56))[1] == []
    failures = admit(spd(BASE, name="a" * 57))[1]
    assert [f.cel for f in failures] == [True]
    assert admit(spd(BASE, name="9lives"))[1] != []


# --- a generated corpus: whatever the CRD admits decodes; whatever CEL rejects, decode_spec
# rejects at the same field -------------------------------------------------------------------

_options = st.fixed_dictionaries(
    {},
    optional={
        "promptLookupMin": st.integers(1, 8),
        "promptLookupMax": st.integers(1, 8),
        "eagleTopk": st.integers(1, 4),
        "numDraftTokens": st.integers(2, 20),
    },
)


@st.composite
def _candidate(draw: st.DrawFn, method: str) -> dict[str, Any]:
    out: dict[str, Any] = {"method": method}
    shape = draw(st.sampled_from(["max", "minmax", "list", "both", "none"]))
    if shape in ("max", "minmax", "both"):
        out["maxK"] = draw(st.integers(1, 8))
    if shape == "minmax":
        out["minK"] = draw(st.integers(1, 8))
    if shape in ("list", "both"):
        out["k"] = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()):
        out["draftModel"] = "org/draft"
    if draw(st.integers(0, 3)) == 0:
        out["options"] = draw(_options)
    return out


@st.composite
def _specs(draw: st.DrawFn) -> dict[str, Any]:
    methods = draw(
        st.lists(st.sampled_from(CANDIDATE_METHODS), min_size=1, max_size=3, unique=True)
    )
    speculative: dict[str, Any] = {"candidates": [draw(_candidate(m)) for m in methods]}
    if draw(st.booleans()):
        speculative["allowOff"] = draw(st.booleans())
    if draw(st.booleans()):
        method = draw(st.sampled_from(["none", *methods]))
        speculative["initial"] = {"method": method}
        if method != "none" or draw(st.integers(0, 4)) == 0:
            speculative["initial"]["k"] = draw(st.integers(1, 8))
    spec: dict[str, Any] = {
        "engine": draw(st.sampled_from(list(ADAPTERS))),
        "model": "org/model",
        "speculative": speculative,
    }
    if draw(st.integers(0, 4)) == 0:
        spec["extraArgs"] = [draw(st.sampled_from(["--max-model-len", "-sc", "--spec-tokens=3"]))]
    if draw(st.integers(0, 4)) == 0:
        spec["tuning"] = {"objective": "goodput"} if draw(st.booleans()) else {"canary": True}
    return spec


def _verdicts(spec: dict[str, Any]) -> tuple[list[Failure], SpecDeploymentSpec | SpecError]:
    stored, failures = admit(spd(spec))
    try:
        return failures, decode_spec(stored["spec"])
    except SpecError as exc:
        return failures, exc


@settings(max_examples=60)
@given(_specs())
def test_decode_spec_agrees_with_the_crd(spec: dict[str, Any]) -> None:
    failures, decoded = _verdicts(spec)
    if not failures:
        assert isinstance(decoded, SpecDeploymentSpec), f"the CRD admits it, decode says {decoded}"
        assert decoded.initial in decoded.candidates
        return
    assert isinstance(decoded, SpecError), f"the CRD rejects it ({failures}), decode accepts"
    cel = [f for f in failures if f.cel]
    if cel:
        assert any(_same_field(f.path, decoded.field) for f in cel), (cel, decoded.field)


# --- status helpers ------------------------------------------------------------------------

STATUS_CONFIGS = [
    SpecConfig(),
    SpecConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4),
    SpecConfig(method="eagle", num_speculative_tokens=3, draft_model="d", eagle_topk=4,
               num_draft_tokens=8),
    SpecConfig(method="eagle3", num_speculative_tokens=4, draft_model="d",
               schedule=((1, 8, 4), (9, 64, 0))),
    SpecConfig(method="mtp", num_speculative_tokens=2, engine_adaptive=True),
]  # fmt: skip


@pytest.mark.parametrize("config", STATUS_CONFIGS, ids=lambda c: c.describe())
def test_status_config_round_trips_and_fits_the_status_schema(config: SpecConfig) -> None:
    status = config_to_status(config)
    assert config_from_status(status) == config
    obj = spd(BASE)
    obj["status"] = {
        "phase": "Running",
        "currentConfig": status,
        "recommendation": {"config": status, "reason": "r", "predictedGain": 0.1},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
        ],
    }  # fmt: skip
    stored, failures = admit(obj)
    assert failures == []
    assert stored["status"] == obj["status"]  # nothing pruned
