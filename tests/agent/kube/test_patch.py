"""The injection plan: the JSON Patch both paths share, its idempotence, and an uninject
that gives back exactly the input, over generated Pod templates."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.agent.kube import (
    InjectionError,
    Settings,
    apply_patch,
    plan_injection,
    uninject_template,
)
from tests.agent.kube import rfc6902
from tests.agent.kube.samples import IMAGE, pod_template

INJECT = {"semhealth.io/inject": "true"}
SETTINGS = Settings(image=IMAGE)
EVERYWHERE = Settings(image=IMAGE, inject_all=True)


def injected(template: dict[str, Any], settings: Settings = SETTINGS) -> dict[str, Any]:
    plan = plan_injection(template, settings)
    assert plan.inject, plan.reason
    result: dict[str, Any] = apply_patch(template, plan.operations)
    return result


def test_annotated_template_gets_the_container_volumes_and_status() -> None:
    template = pod_template(INJECT)
    result = injected(template)
    names = [c["name"] for c in result["spec"]["containers"]]
    assert names == ["app", "vllm", "semhealth"]
    assert [v["name"] for v in result["spec"]["volumes"]] == [
        "models",
        "semhealth-config",
        "semhealth-tmp",
    ]
    status = json.loads(result["metadata"]["annotations"]["semhealth.io/status"])
    assert status == {
        "version": 1,
        "containers": ["semhealth"],
        "volumes": ["semhealth-config", "semhealth-tmp"],
        "created": [],
    }
    # The user's containers are untouched, and so is the input.
    assert result["spec"]["containers"][:2] == pod_template(INJECT)["spec"]["containers"]
    assert template == pod_template(INJECT)


def test_the_patch_is_plain_rfc6902_adds_with_escaped_pointers() -> None:
    plan = plan_injection(pod_template(INJECT), SETTINGS)
    assert [(op.op, op.path) for op in plan.operations] == [
        ("add", "/spec/containers/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/metadata/annotations/semhealth.io~1status"),
    ]


def test_missing_metadata_annotations_and_volumes_are_created_and_recorded() -> None:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "app", "image": "a"}]}}
    plan = plan_injection(template, EVERYWHERE)
    assert [op.path for op in plan.operations][:2] == ["/metadata", "/metadata/annotations"]
    result = apply_patch(template, plan.operations)
    status = json.loads(result["metadata"]["annotations"]["semhealth.io/status"])
    assert status["created"] == ["/metadata", "/metadata/annotations", "/spec/volumes"]
    assert uninject_template(result) == template


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [
        (None, "not asked for (semhealth.io/inject)"),
        ({"semhealth.io/inject": "false"}, "not asked for (semhealth.io/inject)"),
    ],
)
def test_templates_not_asking_are_left_alone(
    annotations: dict[str, str] | None, reason: str
) -> None:
    plan = plan_injection(pod_template(annotations), SETTINGS)
    assert (plan.inject, plan.reason, plan.operations) == (False, reason, ())


def test_inject_all_still_respects_an_explicit_opt_out() -> None:
    assert plan_injection(pod_template(None), EVERYWHERE).inject
    assert not plan_injection(pod_template({"semhealth.io/inject": "false"}), EVERYWHERE).inject


def test_a_pod_with_its_own_semhealth_container_is_left_alone_by_inject_and_uninject() -> None:
    template = pod_template(INJECT)
    template["spec"]["containers"].append({"name": "semhealth", "image": "mine"})
    plan = plan_injection(template, SETTINGS)
    assert (plan.inject, plan.reason) == (False, "already has a semhealth container")
    assert uninject_template(template) is None  # not ours: no semhealth.io/status


def test_injecting_twice_changes_nothing() -> None:
    once = injected(pod_template(INJECT))
    plan = plan_injection(once, SETTINGS)
    assert (plan.inject, plan.operations) == (False, ())


def test_takeover_needs_the_model_server_moved_first() -> None:
    annotations = {
        **INJECT,
        "semhealth.io/takeover-port": "8000",
        "semhealth.io/upstream-port": "8001",
    }
    template = pod_template(annotations)
    with pytest.raises(InjectionError) as raised:
        plan_injection(template, SETTINGS)
    assert str(raised.value).startswith(
        "semhealth.io/takeover-port: container 'vllm' still declares port 8000; move the model "
        "server to semhealth.io/upstream-port 8001"
    )
    vllm = template["spec"]["containers"][1]
    vllm["args"] = ["--port", "8001"]
    vllm["ports"] = [{"name": "openai", "containerPort": 8001}]
    result = injected(template)
    sidecar = result["spec"]["containers"][-1]
    assert sidecar["command"][4:8] == [
        "--upstream",
        "http://127.0.0.1:8001",
        "--listen",
        "0.0.0.0:8000",
    ]
    assert sidecar["ports"][0] == {
        "name": "semhealth-proxy",
        "containerPort": 8000,
        "protocol": "TCP",
    }
    # The app container is not edited: it keeps calling localhost:8000, now the sidecar.
    assert result["spec"]["containers"][0] == template["spec"]["containers"][0]


def test_a_port_the_pod_already_declares_is_not_taken() -> None:
    template = pod_template(INJECT)
    template["spec"]["containers"][0]["ports"] = [{"containerPort": 8080}]
    with pytest.raises(InjectionError, match="container 'app' already declares port 8080"):
        plan_injection(template, SETTINGS)


def test_a_volume_name_the_pod_already_uses_is_not_taken() -> None:
    template = pod_template(INJECT)
    template["spec"]["volumes"].append({"name": "semhealth-tmp", "emptyDir": {}})
    with pytest.raises(InjectionError, match="already has a volume named semhealth-tmp"):
        plan_injection(template, SETTINGS)


@pytest.mark.parametrize("policy", ["Never", "OnFailure"])
def test_a_pod_that_runs_to_completion_gets_a_native_sidecar(policy: str) -> None:
    """A Job's Pod would never complete beside a container that serves forever."""
    template = pod_template(INJECT)
    template["spec"]["restartPolicy"] = policy
    result = injected(template)
    assert result["spec"]["containers"] == template["spec"]["containers"]
    (sidecar,) = result["spec"]["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == ("semhealth", "Always")
    status = json.loads(result["metadata"]["annotations"]["semhealth.io/status"])
    assert status["created"] == ["/spec/initContainers"]
    assert uninject_template(result) == template
    assert not plan_injection(result, SETTINGS).inject


@pytest.mark.parametrize(
    ("policy", "annotation", "where"),
    [
        (None, "true", "initContainers"),  # asked for: starts before the app
        ("Never", "false", "containers"),  # a cluster before 1.29
        ("OnFailure", "FALSE", "containers"),
    ],
)
def test_native_sidecar_annotation_chooses_where_the_sidecar_goes(
    policy: str | None, annotation: str, where: str
) -> None:
    template = pod_template({**INJECT, "semhealth.io/native-sidecar": annotation})
    if policy is not None:
        template["spec"]["restartPolicy"] = policy
    result = injected(template)
    assert result["spec"][where][-1]["name"] == "semhealth"
    assert ("restartPolicy" in result["spec"][where][-1]) is (where == "initContainers")
    assert uninject_template(result) == template


def test_native_sidecar_annotation_must_be_true_or_false() -> None:
    template = pod_template({**INJECT, "semhealth.io/native-sidecar": "maybe"})
    with pytest.raises(InjectionError, match=r"semhealth\.io/native-sidecar: 'maybe' is neither"):
        plan_injection(template, SETTINGS)


def test_a_template_without_containers_is_not_a_pod_template() -> None:
    assert not plan_injection({"metadata": {"annotations": INJECT}, "spec": {}}, SETTINGS).inject


# -- properties over generated templates ------------------------------------------------------

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12).filter(
    lambda name: not name.startswith("semhealth")
)
PORTS = st.integers(min_value=1, max_value=65535).filter(lambda port: port not in (8080, 9464))
CONTAINER = st.fixed_dictionaries(
    {"name": NAMES, "image": NAMES},
    optional={
        "ports": st.lists(st.fixed_dictionaries({"containerPort": PORTS}), max_size=2),
        "env": st.lists(
            st.fixed_dictionaries({"name": NAMES, "value": st.text(max_size=8)}), max_size=2
        ),
    },
)
VOLUME = st.fixed_dictionaries({"name": NAMES, "emptyDir": st.just({})})
ANNOTATIONS = st.fixed_dictionaries(
    {},
    optional={
        "example.com/owner": st.text(max_size=8),
        "semhealth.io/inject": st.just("true"),
        "semhealth.io/config-map": st.just("chat-semhealth"),
    },
)
METADATA = st.fixed_dictionaries(
    {}, optional={"labels": st.dictionaries(NAMES, NAMES, max_size=2), "annotations": ANNOTATIONS}
)


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    containers = draw(st.lists(CONTAINER, min_size=1, max_size=3, unique_by=lambda c: c["name"]))
    spec: dict[str, Any] = {"containers": containers}
    volumes = draw(st.none() | st.lists(VOLUME, max_size=3, unique_by=lambda v: v["name"]))
    if volumes is not None:
        spec["volumes"] = volumes  # [] included: it must come back as [], not vanish
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(CONTAINER, max_size=1))
    policy = draw(st.sampled_from([None, "Always", "OnFailure", "Never"]))
    if policy is not None:
        spec["restartPolicy"] = policy
    template: dict[str, Any] = {"spec": spec}
    metadata = draw(st.none() | METADATA)
    if metadata is not None:
        template["metadata"] = metadata
    return template


@settings(max_examples=200, deadline=None)
@given(templates())
def test_inject_then_uninject_gives_back_the_input(template: dict[str, Any]) -> None:
    before = copy.deepcopy(template)
    result = injected(template, EVERYWHERE)
    assert template == before
    assert uninject_template(result) == before


@settings(max_examples=200, deadline=None)
@given(templates())
def test_inject_is_idempotent(template: dict[str, Any]) -> None:
    once = injected(template, EVERYWHERE)
    again = plan_injection(once, EVERYWHERE)
    assert (again.inject, again.operations) == (False, ())


@settings(max_examples=200, deadline=None)
@given(templates())
def test_the_patch_means_the_same_to_an_independent_rfc6902_apply(template: dict[str, Any]) -> None:
    plan = plan_injection(template, EVERYWHERE)
    patch = json.loads(json.dumps([op.to_json() for op in plan.operations]))
    assert rfc6902.apply(template, patch) == apply_patch(template, plan.operations)
