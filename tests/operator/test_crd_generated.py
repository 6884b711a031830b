"""The committed CRD is what the API models generate, byte for byte, and the generator's output
is a structural schema written by a YAML writer that round-trips awkward strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from crd_validation import ROOT

from specpilot.operator.api.crd import CRD_FILES, REGENERATE, main, render_crd
from specpilot.operator.api.models import Spec
from specpilot.operator.api.schema import describe, structural_schema
from specpilot.operator.api.status import SpecDeployment
from specpilot.operator.api.yaml_text import dump_yaml

HOW = f"the CRD is stale: run `{REGENERATE}` (from the repository root) and commit both copies"


@pytest.mark.parametrize("name", CRD_FILES)
def test_committed_crd_is_the_generated_one(name: str) -> None:
    committed = (ROOT / name).read_text(encoding="utf-8")
    assert committed == render_crd(), f"{name}: {HOW}"


def test_header_says_generated_and_how() -> None:
    head = render_crd().split("\napiVersion:")[0]
    assert head.startswith("# GENERATED") and REGENERATE in head


def test_check_mode_reports_stale_and_writing_fixes_it(tmp_path: Path) -> None:
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert not (tmp_path / CRD_FILES[0]).exists()
    assert main(["--root", str(tmp_path)]) == 0
    for name in CRD_FILES:
        assert (tmp_path / name).read_text(encoding="utf-8") == render_crd()
    assert main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / CRD_FILES[1]).write_text("stale\n", encoding="utf-8")
    assert main(["--root", str(tmp_path), "--check"]) == 1


def test_schema_is_structural() -> None:
    text = json.dumps(structural_schema(SpecDeployment))
    for word in ("$ref", "$defs", "anyOf", '"title"', "nullable", '"default": null'):
        assert word not in text


@pytest.mark.parametrize(
    "value",
    ["off", "True", "", "a: b", "#x", "x #y", "- x", "[a]", "{a}", "*a", "!a", "'q'", '"q"',
     "tab\tand\nnewline", "é ünïcode", "  padded ", "1.5", "null", "~", "0x10", "yes"],
)  # fmt: skip
def test_yaml_writer_round_trips_awkward_strings(value: str) -> None:
    document = {"description": value, "rule": value, "enum": [value, "b"], value or "k": value}
    assert yaml.safe_load(dump_yaml(document)) == document


def test_yaml_writer_folds_long_descriptions_and_keeps_them() -> None:
    text = " ".join(["word"] * 60) + ": with a colon # and a hash"
    document = {"a": {"description": text, "items": [{"message": text}, 3, True, 1.5]}}
    dumped = dump_yaml(document)
    assert ">-" in dumped and max(len(line) for line in dumped.splitlines()) <= 100
    assert yaml.safe_load(dumped) == document


def test_describe_names_what_a_node_allows() -> None:
    spec = structural_schema(Spec)["properties"]
    assert describe(spec["engine"]) == "vllm | sglang"
    assert describe(spec["port"]) == "an integer in 1..65535"
    assert describe(spec["command"]) == "a list of 1..32 strings"
    assert describe(spec["tuning"]["properties"]["canary"]) == "true | false"
    assert describe(spec["tuning"]["properties"]["slo"]["properties"]["tpotP95Ms"]) == (
        "a number in [1, 100000]"
    )
