"""What a batch of copies costs the analysis process, straight after another and after a pause.

The analysis process's agent (relevance off, the default configuration otherwise) runs in
this process with its tap socket, on uvloop as there; each batch is the frames a forwarder
would write for whole streams of the proxy bench (``proxy_overhead.py``: 64 OpenAI chat
tokens 20 ms apart, then the stop, usage and ``[DONE]`` events), in one write. The figure is
this thread's CPU (the loop's, where the receiver, the tap, the collectors and the recorder
run) from the write until every stream of the batch is a record, per content event, for
batches of 1, 2, 8 and 16 streams:

- straight after the last batch's records;
- after the loop slept 50 ms or 250 ms (the longest a stream's end waited in a forwarder
  before 2026-12-07, and since): with streams ending every 27 ms, as 50 streams of the proxy
  bench's length do when they come and go steadily, about two streams a batch, or eight;
- after it slept 1.3 s (a stream's length in the proxy bench: how far apart batches come at
  one stream).

Side by side in one run: the cells take turns, round after round. Nothing else of the
process's work is in the figure (the alert evaluation runs on its own thread every 15 s).

    python bench/analysis_batches.py            # about 2 minutes: 15 rounds
    python bench/analysis_batches.py --quick    # about 40 s: 5 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import uvloop
from _workload import chat_exchange
from proxy_overhead import REQUEST_BODY, content_event, final_events

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.wire import DATA, HEADER, Outcome, encode_close, encode_open
from semhealth.collectors.record import StreamRecord

TOKENS = 64
GAP_NS = 20_000_000
TTFT_NS = 50_000_000
BATCHES = (1, 2, 8, 16)  # streams a batch
PAUSES_S = (0.0, 0.05, 0.25, 1.3)  # the loop's sleep before a batch
WARM_UP = 20  # batches of one before anything is measured


def stream_frames(stream_id: int) -> bytes:
    """One bench stream as a forwarder frames it: open, one copy an event, close."""
    start = time.monotonic_ns()
    exchange = chat_exchange(REQUEST_BODY, start_ns=start, ttft_ns=TTFT_NS)
    frames = bytearray(encode_open(stream_id, exchange))
    at = start + TTFT_NS
    for chunk in [content_event(seq) for seq in range(TOKENS)] + [final_events(TOKENS)]:
        frames += HEADER.pack(DATA, stream_id, at, len(chunk)) + chunk
        at += GAP_NS
    frames += encode_close(stream_id, Outcome(end_ns=at), False)
    return bytes(frames)


@dataclass(slots=True)
class Records:
    """Counts the agent's records; wakes a waiter once a count is reached."""

    made: int = 0
    want: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def consume(self, _record: StreamRecord) -> None:
        self.made += 1
        if self.made >= self.want:
            self.done.set()

    async def reach(self, count: int) -> None:
        self.want = count
        self.done.clear()
        if self.made < count:
            await self.done.wait()


class Feeder:
    """Writes batches to the agent's tap socket and times them on this thread."""

    def __init__(self, writer: asyncio.StreamWriter, records: Records) -> None:
        self._writer = writer
        self._records = records
        self._ids: Iterator[int] = itertools.count(1)

    async def batch(self, streams: int, pause_s: float) -> float:
        """CPU µs of this thread per content event for one batch of ``streams``."""
        frames = b"".join(stream_frames(next(self._ids)) for _ in range(streams))
        if pause_s:
            await asyncio.sleep(pause_s)
        started = time.thread_time_ns()
        self._writer.write(frames)
        # Bounded: a batch whose records never came is a broken agent, not a slow one.
        await asyncio.wait_for(self._records.reach(self._records.made + streams), 30)
        return (time.thread_time_ns() - started) / 1e3 / (streams * TOKENS)


async def measure(rounds: int) -> dict[tuple[int, float], list[float]]:
    records = Records()
    config = load_config(
        None, {}, {"upstream.url": "http://127.0.0.1:9", "relevance.enabled": False}
    )
    with tempfile.TemporaryDirectory() as directory:
        tap_socket = os.path.join(directory, "tap.sock")
        agent = Agent(
            config,
            Settings(
                tap_socket=tap_socket,
                admin_socket=os.path.join(directory, "admin.sock"),
                consumers=(records.consume,),
            ),
        )
        await agent.start()
        try:
            _, writer = await asyncio.open_unix_connection(tap_socket)
            feeder = Feeder(writer, records)
            for _ in range(WARM_UP):
                await feeder.batch(1, 0.0)
            cells: dict[tuple[int, float], list[float]] = {
                (streams, pause): [] for streams in BATCHES for pause in PAUSES_S
            }
            for round_index in range(rounds):
                order = list(cells)
                shift = round_index % len(order)  # each cell runs after each of the others
                for cell in order[shift:] + order[:shift]:
                    cells[cell].append(await feeder.batch(*cell))
            writer.close()
            return cells
        finally:
            await agent.shutdown()


def report(cells: dict[tuple[int, float], list[float]], rounds: int) -> None:
    print(
        f"The analysis process's agent, in this process, fed the proxy bench's streams over its "
        f"tap socket; {rounds} rounds.\nµs of this thread's CPU per content event (median), from "
        "the batch's write to its last record; in brackets, against the same batch straight "
        "after another."
    )
    labels = ["straight after"] + [f"after {pause * 1000:g} ms" for pause in PAUSES_S[1:]]
    header = "".join(f"{label:>22}" for label in labels)
    print(f"{'streams a batch':<16}{header}")
    for streams in BATCHES:
        straight = statistics.median(cells[(streams, 0.0)])
        row = [f"{straight:>22.1f}"]
        for pause in PAUSES_S[1:]:
            paused = statistics.median(cells[(streams, pause)])
            row.append(f"{paused:>13.1f} (x{paused / straight:.2f})")
        print(f"{streams:<16}{''.join(row)}")
    load = os.getloadavg()[0]
    print(f"1-minute load at the end: {load:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds instead of 15")
    rounds = 5 if parser.parse_args().quick else 15
    cells = uvloop.run(measure(rounds))  # the analysis process's loop
    report(cells, rounds)


if __name__ == "__main__":
    main()
