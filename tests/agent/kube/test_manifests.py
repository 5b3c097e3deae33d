"""``semhealth inject`` over manifests: every workload kind, List objects, multi-document
files, documents left alone written back as they were, and uninject as the exact inverse."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from semhealth.agent.kube import (
    POD_TEMPLATE_PATHS,
    InjectionError,
    ManifestError,
    Settings,
    inject_text,
    uninject_text,
)
from tests.agent.kube.samples import IMAGE, deployment, pod_template

SETTINGS = Settings(image=IMAGE)
INJECT = {"semhealth.io/inject": "true"}

CONFIGMAP = """\
# Settings of the chat app: comments and layout must survive injection.
apiVersion: v1
kind: ConfigMap
metadata: {name: chat-settings}   # flow style stays flow style
data:
  MODEL: "llama-3-8b"
  TEMPERATURE: '0.2'
"""
SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: chat
spec:
  selector: {app: chat}
  ports: [{port: 80, targetPort: http}]
"""


def dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False)


def documents(text: str) -> list[Any]:
    return list(yaml.safe_load_all(text))


def containers_at(
    document: dict[str, Any], path: tuple[str, ...], where: str = "containers"
) -> list[str]:
    template: Any = document
    for key in path:
        template = template[key]
    return [c["name"] for c in template["spec"][where]]


def workload(kind: str, annotations: dict[str, str] | None) -> dict[str, Any]:
    template = pod_template(annotations)
    if kind in ("Job", "CronJob"):
        template["spec"]["restartPolicy"] = "OnFailure"  # required by the API for a Job
    if kind == "Pod":
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat", **template["metadata"]},
            "spec": template["spec"],
        }
    if kind == "CronJob":
        spec: dict[str, Any] = {
            "schedule": "*/5 * * * *",
            "jobTemplate": {"spec": {"template": template}},
        }
    elif kind == "PodTemplate":
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"name": "chat"},
            "template": template,
        }
    else:
        spec = {"selector": {"matchLabels": {"app": "chat"}}, "template": template}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "chat"}, "spec": spec}


@pytest.mark.parametrize("kind", sorted(POD_TEMPLATE_PATHS))
def test_every_workload_kind_gets_the_sidecar_in_its_pod_template(kind: str) -> None:
    out, outcomes = inject_text(dump(workload(kind, INJECT)), SETTINGS, source="app.yaml")
    (document,) = documents(out)
    if kind in ("Job", "CronJob"):  # run to completion: a native sidecar
        assert containers_at(document, POD_TEMPLATE_PATHS[kind]) == ["app", "vllm"]
        assert containers_at(document, POD_TEMPLATE_PATHS[kind], "initContainers") == ["semhealth"]
    else:
        assert containers_at(document, POD_TEMPLATE_PATHS[kind]) == ["app", "vllm", "semhealth"]
    assert [(o.where, o.changed) for o in outcomes] == [(f"app.yaml#1 {kind}/chat", True)]


def test_untouched_documents_pass_through_byte_for_byte() -> None:
    text = CONFIGMAP + "---\n" + dump(deployment(None)) + "--- # the Service\n" + SERVICE
    out, outcomes = inject_text(text, SETTINGS)
    assert out == text
    assert [o.changed for o in outcomes] == [False]


def test_only_the_annotated_document_changes_in_a_multi_document_file() -> None:
    text = "---\n" + CONFIGMAP + "---\n" + dump(deployment(INJECT)) + "---\n" + SERVICE
    out, _ = inject_text(text, SETTINGS)
    assert out.startswith("---\n" + CONFIGMAP + "---\n")
    assert out.endswith("---\n" + SERVICE)
    _, injected, _ = documents(out)
    assert containers_at(injected, ("spec", "template")) == ["app", "vllm", "semhealth"]
    # Everything outside the Pod template is as it was, keys in their order.
    assert list(injected) == list(deployment(INJECT))
    assert injected["spec"]["replicas"] == 2


def test_list_objects_are_injected_item_by_item() -> None:
    items = [deployment(INJECT, "a"), deployment(None, "b"), yaml.safe_load(SERVICE)]
    text = dump({"apiVersion": "v1", "kind": "List", "items": items})
    out, outcomes = inject_text(text, SETTINGS)
    (listed,) = documents(out)
    assert [containers_at(item, ("spec", "template")) for item in listed["items"][:2]] == [
        ["app", "vllm", "semhealth"],
        ["app", "vllm"],
    ]
    assert listed["items"][1:] == items[1:]
    assert [(o.where, o.changed) for o in outcomes] == [
        ("-#1.items[0] Deployment/a", True),
        ("-#1.items[1] Deployment/b", False),
    ]


def test_all_injects_unannotated_templates_but_not_opted_out_ones() -> None:
    text = (
        dump(deployment(None, "a"))
        + "---\n"
        + dump(deployment({"semhealth.io/inject": "false"}, "b"))
    )
    out, _ = inject_text(text, Settings(image=IMAGE, inject_all=True))
    first, second = documents(out)
    assert containers_at(first, ("spec", "template")) == ["app", "vllm", "semhealth"]
    assert containers_at(second, ("spec", "template")) == ["app", "vllm"]


def test_injecting_twice_changes_nothing() -> None:
    text = (
        CONFIGMAP + "---\n" + dump(deployment(INJECT)) + "---\n" + dump(workload("CronJob", INJECT))
    )
    once, _ = inject_text(text, SETTINGS)
    twice, outcomes = inject_text(once, SETTINGS)
    assert twice == once
    assert [o.changed for o in outcomes] == [False, False]


def test_uninject_gives_back_the_input() -> None:
    text = (
        CONFIGMAP
        + "---\n"
        + dump(deployment(INJECT))
        + "---\n"
        + dump(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [workload("StatefulSet", INJECT), workload("Job", INJECT)],
            }
        )
    )
    injected, _ = inject_text(text, SETTINGS)
    assert documents(injected) != documents(text)
    back, outcomes = uninject_text(injected)
    assert documents(back) == documents(text)
    assert back.startswith(CONFIGMAP)  # untouched documents stay byte for byte
    assert [o.changed for o in outcomes] == [True, True, True]


def test_uninject_leaves_a_sidecar_it_did_not_add() -> None:
    template = pod_template(INJECT)
    template["spec"]["containers"].append({"name": "semhealth", "image": "hand-written"})
    text = dump(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": template["spec"]}
    )
    assert uninject_text(text)[0] == text
    assert inject_text(text, Settings(image=IMAGE, inject_all=True))[0] == text


def test_json_input_is_read_and_written_as_yaml() -> None:
    text = json.dumps(deployment(INJECT))
    out, _ = inject_text(text, SETTINGS)
    (document,) = documents(out)
    assert containers_at(document, ("spec", "template")) == ["app", "vllm", "semhealth"]


def test_empty_and_comment_only_documents_pass_through() -> None:
    text = "# generated by kustomize\n---\n---\n# nothing\n"
    assert inject_text(text, SETTINGS) == (text, [])


def test_invalid_yaml_names_the_file_and_document() -> None:
    with pytest.raises(ManifestError, match=r"^app.yaml: document 2 is not YAML"):
        inject_text(SERVICE + "---\nkind: [unclosed\n", SETTINGS, source="app.yaml")


def test_an_injection_error_names_the_object() -> None:
    bad = deployment({**INJECT, "semhealth.io/proxy-port": "eighty"})
    with pytest.raises(
        InjectionError, match=r"^app.yaml#1 Deployment/chat: semhealth.io/proxy-port"
    ):
        inject_text(dump(bad), SETTINGS, source="app.yaml")


def test_uninject_refuses_a_status_it_did_not_write() -> None:
    template = pod_template({"semhealth.io/status": "{not json"})
    text = dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", **template["metadata"]},
            "spec": template["spec"],
        }
    )
    with pytest.raises(
        InjectionError, match=r"^-#1 Pod/p: semhealth\.io/status is not what injection wrote"
    ):
        uninject_text(text)


def test_documents_are_numbered_as_yaml_counts_them() -> None:
    text = (
        "# rendered by helm\n---\n"
        + dump(deployment(INJECT, "a"))
        + "---\n"
        + dump(deployment(INJECT, "b"))
    )
    _, outcomes = inject_text(text, SETTINGS, source="app.yaml")
    assert [o.where for o in outcomes] == ["app.yaml#1 Deployment/a", "app.yaml#2 Deployment/b"]
