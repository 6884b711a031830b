"""A trial at all of the load routes the SpecDeployment's Service to one role's pods and back:
the operator's client over HTTP against the mock API server (KMock with the realism layer, a
MOCK: no real API server runs here), on the operator's own account (the chart's RBAC)."""

from __future__ import annotations

import pytest

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.children import desired_service, selector_labels
from specpilot.operator.kube.client import KubeApiError, KubeRest


def test_the_service_is_routed_to_one_role_and_given_both_back_whole(rest: KubeRest) -> None:
    spec = decode_spec({"engine": "vllm", "model": "m"})
    rest.create(desired_service(name="llm", namespace="default", spec=spec))
    both = selector_labels("llm")
    assert rest.service_selector("default", "llm") == both
    rest.set_service_selector("default", "llm", selector_labels("llm", "canary"))
    assert rest.service_selector("default", "llm") == selector_labels("llm", "canary")
    # the role key is dropped, not merged into what was there
    rest.set_service_selector("default", "llm", both)
    assert rest.service_selector("default", "llm") == both
    assert rest.service_selector("default", "gone") is None
    with pytest.raises(KubeApiError, match="not found"):
        rest.set_service_selector("default", "gone", both)
