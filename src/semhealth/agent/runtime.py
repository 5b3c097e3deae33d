"""What every semhealth process has in common: logging, signals, the event loop, and, for the
processes ``semhealth run`` starts, their own arguments and serving until a signal or their
supervisor's end.

A child of ``semhealth run`` (the analysis process, an extra forwarding process) parses only
its own flags: its sockets, its worker number and the ``RunArgs`` the supervisor resolved
once (the configuration file, the command line's overrides of it, ``--record``). It never
re-reads the supervisor's command line, so it never builds the CLI's parser.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from semhealth.agent.config import ConfigError, load_config
from semhealth.agent.errors import CONFIG_EXIT, SemhealthError
from semhealth.agent.replay.settings import RecordSettings
from semhealth.alerts.errors import AlertsError

if TYPE_CHECKING:
    from semhealth.alerts.model import Rule

log = logging.getLogger("semhealth")

_PARENT_POLL_S = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunArgs:
    """What ``semhealth run`` hands each process it starts, resolved once by the supervisor."""

    config: str | None = None  # the YAML file, if any (``--config-if-present`` resolved)
    overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)
    record: RecordSettings | None = None

    def argv(self) -> tuple[str, ...]:
        """The flags a child parses back into this (``child_parser``)."""
        out: list[str] = []
        if self.config is not None:
            out += ["--config", self.config]
        if self.overrides:
            out += ["--overrides", orjson.dumps(dict(self.overrides)).decode()]
        if self.record is not None:
            out += ["--record", orjson.dumps(dataclasses.asdict(self.record)).decode()]
        return tuple(out)


class Part(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class Reloadable(Protocol):
    async def reload_alerts(self, rules: tuple[Rule, ...]) -> None: ...


Serve = Callable[[argparse.Namespace, RunArgs], Coroutine[Any, Any, int]]


def child_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--tap-socket", required=True)
    parser.add_argument("--admin-socket")
    parser.add_argument("--worker", type=int, default=0)
    # The supervisor's pid, from the supervisor: a child that read its parent's pid itself
    # after the supervisor died would read init's and watch it forever.
    parser.add_argument("--supervisor", type=int)
    parser.add_argument("--config")
    parser.add_argument("--overrides", type=orjson.loads, default={})
    parser.add_argument("--record", type=orjson.loads, default=None)
    return parser


def parse_child_args(prog: str, argv: Sequence[str]) -> tuple[argparse.Namespace, RunArgs]:
    """(this child's own flags, the ``RunArgs`` it was started with)."""
    own = child_parser(prog).parse_args(argv)
    record = RecordSettings(**own.record) if own.record is not None else None
    return own, RunArgs(config=own.config, overrides=own.overrides, record=record)


def setup_logging(level: str, log_format: str = "text") -> None:
    """The root logger at ``level``, writing to stderr as ``log.format`` says: ``text`` for
    people, ``json`` for log collectors (one object per line, see ``JsonFormatter``)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


# What every LogRecord holds; anything else on a record came from ``extra=`` at the call site.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``,
    the fields a call passed as ``extra=``, and ``exception`` when there is one.

    The message is the one the code wrote, as in text: semhealth's log lines hold sizes,
    counts and names, never prompt or response text (a test streams a canary and looks for it
    in every line), so JSON changes the shape, not what is said.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self._time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()

    @staticmethod
    def _time(record: logging.LogRecord) -> str:
        seconds = int(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        return f"{stamp}.{int(record.msecs):03d}Z"


def stop_on_signals(on_hangup: Callable[[], None] | None = None) -> asyncio.Event:
    """An event SIGINT and SIGTERM set; SIGHUP calls ``on_hangup`` when given."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if on_hangup is not None:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
    return stop


async def serve_until_signal(
    run_for: float | None, on_hangup: Callable[[], None] | None = None
) -> None:
    stop = stop_on_signals(on_hangup)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), run_for)


async def reload_rules(agent: Reloadable, run: RunArgs) -> None:
    """SIGHUP: load the configuration again and evaluate its alert rules from now on. A bad
    file keeps the running rules, as a Prometheus reload does."""

    def load() -> tuple[Rule, ...]:
        # Checked and loaded in one go: a rules file edited in between cannot slip through.
        return load_config(run.config, os.environ, dict(run.overrides)).alerts.load_rules()

    try:
        rules = await asyncio.to_thread(load)
        await agent.reload_alerts(rules)
    except (ConfigError, AlertsError, RuntimeError) as exc:
        log.error("alert rules not reloaded; the running rules stay:\n%s", exc)
        return
    log.info("alert rules reloaded from %s: %d rules", run.config, len(rules))


def run_async(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: int = uvloop.run(main)
    return result


def resolve_config_file(args: argparse.Namespace) -> None:
    """``--config-if-present FILE`` becomes ``--config FILE`` when the file is there, and no
    file otherwise (warned once the log is set up, by ``warn_missing_config``)."""
    wanted = getattr(args, "config_if_present", None)
    if wanted is not None:
        args.config = wanted if os.path.exists(wanted) else None
        args.config_missing = None if args.config else wanted


def warn_missing_config(args: argparse.Namespace) -> None:
    missing = getattr(args, "config_missing", None)
    if missing:
        log.warning(
            "no configuration file at %s (is its ConfigMap in this namespace?): running on the "
            "defaults and the command line",
            missing,
        )


async def watch_parent(stop: asyncio.Event, parent: int) -> None:
    """A child whose supervisor (``parent``, read when the child started) is gone stops
    too: it would be reparented, not killed.

    On Linux the supervisor's end is told by a pidfd, which costs no wake-up until then (a
    poll every half second was two of an idle analysis process's three wake-ups a second);
    elsewhere it is polled.
    """
    pidfd = _open_pidfd(parent)
    if pidfd is None:
        await _poll_parent(stop, parent)
        return
    loop = asyncio.get_running_loop()
    try:
        if os.getppid() != parent:  # gone before the pidfd was open: it may be another's pid
            _parent_gone(stop)
            return
        loop.add_reader(pidfd, _parent_gone, stop)
        try:
            await stop.wait()
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)


def _open_pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)  # Linux 5.3 and later
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:
        return None  # gone already, or a kernel without it: polling says which


async def _poll_parent(stop: asyncio.Event, parent: int) -> None:
    while not stop.is_set():
        if os.getppid() != parent:
            _parent_gone(stop)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _PARENT_POLL_S)


def _parent_gone(stop: asyncio.Event) -> None:
    if not stop.is_set():
        log.warning("the supervising process is gone: stopping")
        stop.set()


async def serve_until_stopped(part: Part, parent: int, stop: asyncio.Event | None = None) -> int:
    """Start ``part``, serve until ``stop`` (by default SIGTERM/SIGINT; make it with
    ``stop_on_signals`` first, so a stop while the part starts is a clean stop) or the
    supervisor's end, then shut it down."""
    stop = stop or stop_on_signals()
    await part.start()
    try:
        await watch_parent(stop, parent)
    finally:
        await part.shutdown()
    return 0


def run_child(prog: str, serve: Serve, argv: Sequence[str] | None = None) -> int:
    """A child's ``main``: its exit code, with start-up failures said plainly. ``own.parent``
    is the supervisor's pid: as the supervisor passed it, else the parent's read first (it
    may die while this child loads)."""
    parent = os.getppid()
    own, run = parse_child_args(prog, sys.argv[1:] if argv is None else argv)
    own.parent = own.supervisor or parent
    try:
        return run_async(serve(own, run))
    except ConfigError as exc:
        print(f"{prog}: configuration is not valid:\n{exc}", file=sys.stderr)
        return CONFIG_EXIT
    except SemhealthError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
