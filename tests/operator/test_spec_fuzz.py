"""Generated SpecDeployments, valid and invalid, judged by the CRD (schema + CEL, as the API
server would, tests/operator/crd_validation.py) and by `decode_spec`, then rendered.

The promises: nothing raises but `SpecError` (never a traceback, so never a crash loop of the
reconcile handler); the CRD and the decoder agree (what one admits the other accepts; what one
refuses the other refuses at the same field); and a spec both accept renders children that
are valid Kubernetes objects, whose engine command line carries every free-text value (model
names, extraArgs, env values, command) verbatim as one argv entry or one env value, never
through a shell, and parses back to the configuration it was rendered for.
"""

from __future__ import annotations

import posixpath
from typing import Any

import httpx
import kubernetes_validate
import pytest
from crd_validation import Failure, admit, cel_errors, root_schema, strip_indexes
from hypothesis import HealthCheck, find, given, settings
from kube.apiserver import ApiServer
from kube.faults import fail_next
from spec_strategies import HOSTILE_TEXTS, mutated, specs
from tuning_helpers import create
from tuning_helpers import spd as spd_of

from specpilot.operator.api.flags import owned_flag
from specpilot.operator.api.spec import SpecDeploymentSpec, SpecError, decode_spec
from specpilot.operator.kube.children import desired_children
from specpilot.operator.kube.client import KubeApiError, KubeConflict, KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.status import degraded_status
from specpilot.runtime.engines import get_adapter
from specpilot.tuner import SpecConfig

HOSTILE = set(HOSTILE_TEXTS) - {"", "-", "--"}
K8S_VERSION = "1.35.0"
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "-c"}
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _spd(spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": "llm", "namespace": "default"},
        "spec": spec,
    }


def _same_field(a: str, b: str) -> bool:
    a, b = strip_indexes(a), strip_indexes(b)
    return a.startswith(b) or b.startswith(a)


def _judge(spec: Any) -> tuple[dict[str, Any], list[Failure], SpecDeploymentSpec | SpecError]:
    """(stored object, admission failures, decoder verdict); only SpecError may be raised."""
    stored, failures = admit(_spd(spec))
    try:
        return stored, failures, decode_spec(stored["spec"])
    except SpecError as exc:
        return stored, failures, exc


def _cel_anyway(stored: dict[str, Any]) -> list[Failure]:
    """The CEL rules' verdicts on an object the schema refused, which the API server would not
    evaluate (a rule that errors on a mistyped value fails, as on the server; one that trips
    cel-python itself adds nothing)."""
    try:
        return cel_errors(stored, root_schema())
    except Exception:  # a mistyped value can trip cel-python anywhere
        return []


def _check_agreement(spec: Any) -> SpecDeploymentSpec | None:
    stored, failures, verdict = _judge(spec)
    if not failures:
        assert isinstance(verdict, SpecDeploymentSpec), f"admitted, but the decoder says {verdict}"
        return verdict
    assert isinstance(verdict, SpecError), f"refused ({failures}), but the decoder accepts it"
    assert verdict.field.startswith("spec"), verdict.field
    # The server lists every schema error (and runs CEL only on a schema-valid object); the
    # decoder names one: it must be one of them, or one a CEL rule would report.
    everything = failures + _cel_anyway(stored)
    assert any(_same_field(f.path, verdict.field) for f in everything), (failures, str(verdict))
    # what the status condition keeps (the same text goes to kopf's Event and log) names the
    # field and what is allowed, however long the value; an env value is never repeated
    condition = degraded_status({}, str(verdict), 1)["conditions"][0]["message"]
    assert verdict.field in condition and "allowed" in condition, condition
    for value in _env_values(spec):
        assert value not in condition, f"an env value reached the status: {condition}"
    return None


def _env_values(spec: Any) -> list[str]:
    """The env values written in `spec` (long enough not to occur by chance), less any that
    the spec also writes outside env: the strategies draw from one pool of texts, and a command
    flag the error rightly quotes may be an env value too (`--port=1` in both, found by this
    test)."""
    env = spec.get("env") if isinstance(spec, dict) else None
    entries = env if isinstance(env, list) else list(env.values()) if isinstance(env, dict) else []
    values = [e.get("value") if isinstance(e, dict) else e for e in entries]
    elsewhere = repr({k: v for k, v in spec.items() if k != "env"}) if env is not None else ""
    return [v for v in values if isinstance(v, str) and len(v) >= 8 and v not in elsewhere]


def _files(children: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """The sidecar files the engine container sees: its ConfigMap's keys at the mount path."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    out: dict[str, str] = {}
    for volume in pod["volumes"]:
        if "configMap" not in volume:
            continue
        (cm,) = [c for c in children if c["metadata"]["name"] == volume["configMap"]["name"]]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        out |= {posixpath.join(mount["mountPath"], k): v for k, v in cm["data"].items()}
    return out


def _check_rendering(spec: SpecDeploymentSpec, config: SpecConfig) -> None:
    children = desired_children(
        name="llm", namespace="default", spec=spec, config=config, canary_config=spec.initial
    )
    for child in children:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
    adapter = get_adapter(spec.engine)
    for deployment in (c for c in children if c["kind"] == "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        command, args = container["command"], container["args"]
        assert all(isinstance(a, str) for a in [*command, *args])
        assert not SHELLS & {command[0], *command[1:2]}, command  # no shell runs the line
        if spec.command is not None:
            assert command == list(spec.command)
        # the model is one argv entry after its flag; extraArgs are the tail, unchanged
        assert args[args.index(spec.model) - 1] in ("--model", "--model-path"), args
        assert tuple(args[len(args) - len(spec.extra_args) :]) == spec.extra_args
        env = {e["name"]: e for e in container.get("env", [])}
        for var in spec.env:
            if var.value is not None:
                assert env[var.name]["value"] == var.value
            elif var.secret_key_ref is not None:  # a reference, never the secret's value
                ref = env[var.name]["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) == var.secret_key_ref
        role_config = config if deployment["metadata"]["name"] == "llm" else spec.initial
        assert adapter.parse(args, files=_files(children, deployment)) == role_config


@FUZZ
@given(specs())
def test_generated_specs_agree_and_render_valid_objects(spec: dict[str, Any]) -> None:
    decoded = _check_agreement(spec)
    if decoded is not None:
        for config in {decoded.initial, decoded.candidates[-1]}:
            _check_rendering(decoded, config)


@FUZZ
@given(mutated(specs()))
def test_mutated_specs_are_refused_at_a_named_field_never_a_traceback(spec: dict[str, Any]) -> None:
    decoded = _check_agreement(spec)
    if decoded is not None:
        _check_rendering(decoded, decoded.initial)


def test_the_generators_reach_both_verdicts() -> None:
    """The properties above test something: the strategies draw specs both admitted and refused,
    admitted ones with hostile free text in them."""

    def admitted(spec: dict[str, Any]) -> bool:
        return not admit(_spd(spec))[1]

    hostile = find(specs(), lambda s: admitted(s) and bool(set(s.get("extraArgs", [])) & HOSTILE))
    assert admitted(hostile)
    assert not admitted(find(specs(), lambda s: not admitted(s)))
    assert not admitted(find(mutated(specs()), lambda s: not admitted(s)))


# (a flag SpecPilot owns, "--port=1", is refused: test_crd_schema.py's INVALID table)
FREE_TEXTS = [t for t in HOSTILE_TEXTS if owned_flag(t) is None]


@pytest.mark.parametrize("text", FREE_TEXTS, ids=range(len(FREE_TEXTS)))
def test_hostile_text_reaches_the_pod_verbatim_or_is_refused_naming_the_field(text: str) -> None:
    """Shell metacharacters, quotes, newlines and 10 kB values: in env values (up to 32 kB),
    extraArgs and command (up to 4 kB and 1 kB an entry) they reach the container unchanged, one
    argv entry or one value each, and no shell; past the bounds both the CRD and the decoder
    refuse them naming the entry and the bound."""
    spec = {
        "engine": "sglang",
        "model": "org/m $(x)",
        "env": [{"name": "NOTE", "value": text}],
        "extraArgs": ["--chat-template", text],
        "command": ["specpilot", "emulate", text],
    }
    limit = {"extraArgs": 4096, "command": 1024}
    too_long = [key for key, most in limit.items() if len(text) > most]
    decoded = _check_agreement(spec)
    if not too_long:
        assert decoded is not None, text
        _check_rendering(decoded, decoded.initial)
        return
    assert decoded is None
    with pytest.raises(SpecError) as err:
        decode_spec(spec)
    assert err.value.field in ("spec.extraArgs[1]", "spec.command[2]"), err.value.field
    assert f"at most {limit[err.value.field.split('.')[1].split('[')[0]]}" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "field", "allowed"),
    [
        ({"extraArgs": ["x" * 10_240]}, "spec.extraArgs[0]", "at most 4096 characters"),
        ({"model": "m" * 10_240}, "spec.model", "1..1024 characters"),
        ({"env": [{"name": "HF_TOKEN", "value": "hf_" + "s" * 40_000}]}, "spec.env[0].value",
         "at most 32768 characters"),
        ({"env": [{"name": "HF_TOKEN", "value": "hf_s3cr3t_t0k3n", "valueFrom": {
            "secretKeyRef": {"name": "hf", "key": "token"}}}]}, "spec.env[0]",
         "exactly one of value and valueFrom"),
        ({"env": {"HF_TOKEN": "hf_s3cr3t_t0k3n"}}, "spec.env", "a list of at most 64 objects"),
    ],
)  # fmt: skip
def test_the_status_names_the_field_and_the_bound_past_a_10kb_value_and_hides_env_values(
    spec: dict[str, Any], field: str, allowed: str
) -> None:
    """A condition keeps 1,024 characters: a 10 kB value once filled it and cut off what is
    allowed. An env value may be a credential written inline: it never reaches status, Events
    or logs (all three get this message)."""
    with pytest.raises(SpecError) as err:
        decode_spec({"engine": "vllm", "model": "org/m", **spec})
    assert err.value.field == field
    condition = degraded_status({}, str(err.value), 1)["conditions"][0]["message"]
    assert "is invalid: allowed" in condition and allowed in condition, condition
    assert "s3cr3t" not in condition and "sssssssss" not in condition, condition


def test_a_key_kubernetes_does_not_know_in_a_security_context_never_reaches_the_pod() -> None:
    """Both security contexts were typed at their top only and kept the rest as written: a
    stray key (a typo, `extra`) passed admission and made the rendered Deployment invalid, which
    the API server refuses on every reconcile. Now every field is typed: the server prunes the
    stray key, the decoder refuses it by name, and the pod is valid."""
    pod = {
        "securityContext": {"runAsNonRoot": True, "sysctls": [{"name": "a.b", "value": "1"}],
                            "seLinuxOptions": {"level": "s0"}, "extra": 1},
        "containerSecurityContext": {"capabilities": {"drop": ["ALL"], "extra": []},
                                     "procMount": "Default", "runAsUser": None, "extra": 1},
    }  # fmt: skip
    spec = {"engine": "vllm", "model": "org/m", "pod": pod}
    stored, failures = admit(_spd(spec))
    assert failures == []
    assert "extra" not in stored["spec"]["pod"]["securityContext"]
    assert stored["spec"]["pod"]["containerSecurityContext"] == {
        "capabilities": {"drop": ["ALL"]},
        "procMount": "Default",
    }
    _check_rendering(decode_spec(stored["spec"]), SpecConfig())
    with pytest.raises(SpecError) as err:
        decode_spec(spec)
    assert err.value.field == "spec.pod.securityContext.extra"
    assert "unknown field" in str(err.value) and "runAsNonRoot" in str(err.value)


@pytest.mark.parametrize("verb", ["post", "patch"])
def test_a_child_the_api_server_refuses_is_reported_in_a_condition(
    api: ApiServer, rest: KubeRest, verb: str
) -> None:
    """What spec.pod keeps as written (affinity, volume sources) reaches the pod template
    unchecked; a value Kubernetes refuses there fails the Deployment's create or patch (422).
    That was an API error retried with no word in status (a refused patch even read as a lost
    race, retried every second); now Degraded says which child the server refused and why,
    and the next reconcile that goes through clears it."""
    body = create(api, "refused")
    if verb == "patch":  # the Deployment exists; an edit of the spec patches its template
        reconcile(rest, body)
        edit = {"spec": {"port": 9000}}
        path = f"{api.url}/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments/refused"
        patched = httpx.patch(
            path, json=edit, headers={"Content-Type": "application/merge-patch+json"}
        )
        patched.raise_for_status()
    fault = fail_next(api, verb, "apps", "v1", "deployments", status=422)
    with pytest.raises(KubeApiError) as refused:
        reconcile(rest, spd_of(api, "refused"))
    assert fault.hits == 1 and not isinstance(refused.value, KubeConflict)
    (degraded,) = [c for c in spd_of(api, "refused")["status"]["conditions"]
                   if c["type"] == "Degraded"]  # fmt: skip
    assert (degraded["status"], degraded["reason"]) == ("True", "ChildRejected")
    assert "Deployment/refused" in degraded["message"] and "HTTP 422" in degraded["message"]
    reconcile(rest, spd_of(api, "refused"))
    (degraded,) = [c for c in spd_of(api, "refused")["status"]["conditions"]
                   if c["type"] == "Degraded"]  # fmt: skip
    assert degraded["status"] == "False"
