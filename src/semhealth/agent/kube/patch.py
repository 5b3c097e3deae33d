"""The one code path: a Pod template in, the JSON Patch that injects it out.

``plan_injection`` looks at an object shaped like a Pod (``metadata`` and ``spec``: a Pod,
or a workload's Pod template) and returns RFC 6902 operations relative to it. The webhook
sends them as they are; ``semhealth inject`` applies them to the template with
``apply_patch``. So both produce the same Pod spec by construction.

What is added is recorded in the ``semhealth.io/status`` annotation (the container, the
volumes and every map or list the patch had to create), so ``uninject_template`` removes
exactly that and nothing the user wrote.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semhealth.agent.kube.errors import InjectionError
from semhealth.agent.kube.settings import (
    ADMIN_PORT,
    STATUS,
    TAKEOVER_PORT,
    Options,
    Settings,
    read_options,
    wants_injection,
)
from semhealth.agent.kube.sidecar import CONTAINER, VOLUMES, container, volumes

STATUS_VERSION = 1


@dataclass(frozen=True)
class Operation:
    """One RFC 6902 operation; only ``add`` is emitted, so ``value`` is always set."""

    op: str
    path: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "path": self.path, "value": self.value}


@dataclass(frozen=True)
class Plan:
    """What to do with one template: inject or not (and why, for logs), and the patch."""

    inject: bool
    reason: str
    operations: tuple[Operation, ...] = ()


def plan_injection(template: Mapping[str, Any], settings: Settings) -> Plan:
    """The patch that adds the sidecar to ``template``, or why it gets none.

    Raises ``InjectionError`` (``AnnotationError``) when the template asks for the sidecar
    but cannot have it as asked; the message names the annotation and the fix.
    """
    annotations = _annotations(template)
    spec = template.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers"), list):
        return Plan(False, "no Pod spec with containers")
    problem = _shape_problem(spec)
    if problem is not None:  # the API server refuses it anyway; not ours to repair
        return Plan(False, problem)
    if not wants_injection(annotations, settings):
        return Plan(False, "not asked for (semhealth.io/inject)")
    if CONTAINER in _container_names(spec):
        return Plan(False, f"already has a {CONTAINER} container")
    runs_to_completion = spec.get("restartPolicy") in ("Never", "OnFailure")
    options = read_options(
        annotations, settings, runs_to_completion=runs_to_completion, labels=_labels(template)
    )
    _check_free(spec, options, takeover=TAKEOVER_PORT in annotations)
    return Plan(True, "injected", tuple(_operations(template, options)))


def _operations(template: Mapping[str, Any], options: Options) -> list[Operation]:
    ops: list[Operation] = []
    created: list[str] = []
    metadata = template.get("metadata")
    if not isinstance(metadata, Mapping):
        ops.append(Operation("add", "/metadata", {}))
        created.append("/metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("annotations"), Mapping):
        ops.append(Operation("add", "/metadata/annotations", {}))
        created.append("/metadata/annotations")
    # A native sidecar is an init container the kubelet keeps running and stops after the
    # app's containers exit: a Job's Pod then still completes.
    where = "initContainers" if options.native else "containers"
    sidecar = container(options)
    if options.native:
        sidecar["restartPolicy"] = "Always"
        if not isinstance(template["spec"].get(where), list):
            ops.append(Operation("add", f"/spec/{where}", []))
            created.append(f"/spec/{where}")
    ops.append(Operation("add", f"/spec/{where}/-", sidecar))
    if not isinstance(template["spec"].get("volumes"), list):
        ops.append(Operation("add", "/spec/volumes", []))
        created.append("/spec/volumes")
    ops += [Operation("add", "/spec/volumes/-", volume) for volume in volumes(options)]
    status = {
        "version": STATUS_VERSION,
        "containers": [CONTAINER],
        "volumes": list(VOLUMES),
        "created": created,
    }
    ops.append(
        Operation(
            "add",
            "/metadata/annotations/" + _escape(STATUS),
            json.dumps(status, separators=(",", ":")),
        )
    )
    return ops


def _shape_problem(spec: Mapping[str, Any]) -> str | None:
    """What makes ``spec`` not a Pod spec in the lists injection reads, or None."""
    for key in ("containers", "initContainers", "volumes"):
        items = spec.get(key)
        if items is not None and not _list_of_objects(items):
            return f"spec.{key} is not a list of objects"
    for each in [*spec["containers"], *(spec.get("initContainers") or [])]:
        if each.get("ports") is not None and not _list_of_objects(each["ports"]):
            return "a container's ports are not a list of objects"
    return None


def _list_of_objects(items: Any) -> bool:
    return isinstance(items, list) and all(isinstance(item, Mapping) for item in items)


def _check_free(spec: Mapping[str, Any], options: Options, *, takeover: bool) -> None:
    """The sidecar's names and ports must not collide with the Pod's own."""
    taken = [name for name in VOLUMES if name in _volume_names(spec)]
    if taken:
        raise InjectionError(
            f"the Pod already has a volume named {taken[0]}; rename it to inject semhealth"
        )
    ports = _declared_ports(spec)
    if options.proxy_port in ports and takeover:
        raise InjectionError(
            f"{TAKEOVER_PORT}: container {ports[options.proxy_port]!r} still declares port "
            f"{options.proxy_port}; move the model server to semhealth.io/upstream-port "
            f"{options.upstream_port} (its listen flag and containerPort) first"
        )
    for port in (options.proxy_port, ADMIN_PORT):
        if port in ports:
            raise InjectionError(
                f"container {ports[port]!r} already declares port {port}, which the sidecar "
                "needs; set semhealth.io/proxy-port to a free port"
            )


def apply_patch(document: Any, operations: Sequence[Operation]) -> Any:
    """``document`` with ``operations`` applied (RFC 6902 ``add``, the only op emitted);
    the input is not changed."""
    result = copy.deepcopy(document)
    for operation in operations:
        if operation.op != "add":
            raise ValueError(f"unsupported JSON Patch op {operation.op!r}")
        *parents, last = [_unescape(part) for part in operation.path.split("/")[1:]]
        target = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        value = copy.deepcopy(operation.value)
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), value)
        else:
            target[last] = value
    return result


def uninject_template(template: Mapping[str, Any]) -> dict[str, Any] | None:
    """``template`` without what injection added, or None when it was not injected by us
    (no ``semhealth.io/status``): a container someone else wrote is not ours to remove."""
    raw = _annotations(template).get(STATUS)
    if raw is None:
        return None
    try:
        status = json.loads(raw)
        containers, added, created = status["containers"], status["volumes"], status["created"]
    except (ValueError, TypeError, KeyError) as exc:
        raise InjectionError(f"{STATUS} is not what injection wrote: {exc}") from exc
    result: dict[str, Any] = copy.deepcopy(dict(template))
    spec = result["spec"]
    for where in ("containers", "initContainers"):
        if isinstance(spec.get(where), list):
            spec[where] = [c for c in spec[where] if c.get("name") not in containers]
    if isinstance(spec.get("volumes"), list):
        spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in added]
    del result["metadata"]["annotations"][STATUS]
    for path in reversed(created):  # innermost first: /metadata/annotations before /metadata
        _remove_if_empty(result, path)
    return result


def _remove_if_empty(document: dict[str, Any], path: str) -> None:
    *parents, last = path.split("/")[1:]
    target: Any = document
    for part in parents:
        target = target.get(part) if isinstance(target, dict) else None
    if isinstance(target, dict) and target.get(last) in ({}, []):
        del target[last]


def _annotations(template: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = template.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _labels(template: Mapping[str, Any]) -> Mapping[str, str]:
    metadata = template.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _container_names(spec: Mapping[str, Any]) -> set[str]:
    every = [*spec["containers"], *(spec.get("initContainers") or [])]
    return {str(c.get("name")) for c in every}


def _volume_names(spec: Mapping[str, Any]) -> set[str]:
    return {str(v.get("name")) for v in spec.get("volumes") or []}


def _declared_ports(spec: Mapping[str, Any]) -> dict[int, str]:
    """containerPort -> the container declaring it."""
    ports: dict[int, str] = {}
    for each in spec["containers"]:
        for port in each.get("ports") or []:
            if isinstance(port.get("containerPort"), int):
                ports[port["containerPort"]] = str(each.get("name"))
    return ports


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")
