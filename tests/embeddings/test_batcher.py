from __future__ import annotations

import asyncio
import gc
import math
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.embeddings.batcher import BatchCost, MicroBatcher, estimate_tokens
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.config import Batching
from semhealth.embeddings.errors import BackendError, Closed, Overloaded
from semhealth.embeddings.local import LocalBackend
from tests.embeddings.wrappers import Failing, Gated, Recording, WrongShape

TOPICS = ["password resets", "invoices", "GPU drivers", "river ecology", "tax forms", "jazz"]


def texts(count: int, prefix: str = "") -> list[str]:
    """Distinct texts of varied lengths, so sorting and splitting have work to do."""
    return [
        f"{prefix}Note {i} on {TOPICS[i % len(TOPICS)]}." + " More detail follows here." * (i % 7)
        for i in range(count)
    ]


async def one_at_a_time(backend: LocalBackend, items: list[str]) -> np.ndarray:
    return np.concatenate([await backend.embed([text]) for text in items])


@pytest.fixture(scope="module")
def reference(minilm: LocalBackend) -> dict[str, np.ndarray]:
    """Each of ``texts(24)`` embedded alone, computed once for the module."""
    items = texts(24)
    return dict(zip(items, asyncio.run(one_at_a_time(minilm, items)), strict=True))


# -- token estimate --------------------------------------------------------------------------


def test_estimate_counts_four_ascii_characters_as_one_token() -> None:
    assert estimate_tokens("abcdefgh") == 2
    assert estimate_tokens("abcdefghi") == 3


def test_estimate_counts_each_cjk_character_as_one_token() -> None:
    assert estimate_tokens("如何重置密码") == 6
    assert estimate_tokens("パスワード") == 5


def test_estimate_mixes_cjk_and_other_characters() -> None:
    assert estimate_tokens("GPU 驱动程序 error") == 4 + math.ceil(len("GPU  error") / 4)


def test_estimate_is_at_least_one_token() -> None:
    assert estimate_tokens("") == 1


@given(st.text(max_size=300))
def test_estimate_lies_between_a_quarter_and_all_of_the_characters(text: str) -> None:
    tokens = estimate_tokens(text)
    assert max(1, math.ceil(len(text) / 4)) <= tokens <= max(1, len(text))


# -- results ---------------------------------------------------------------------------------


async def test_batched_and_one_at_a_time_embeddings_agree(
    minilm: LocalBackend, reference: dict[str, np.ndarray]
) -> None:
    items = texts(24)
    batcher = MicroBatcher(minilm, Batching(max_batch=32))
    await batcher.start()
    try:
        batched = await batcher.embed(items)
    finally:
        await batcher.shutdown()
    np.testing.assert_allclose(batched, [reference[text] for text in items], atol=1e-5)


async def test_concurrent_callers_each_get_their_own_vectors(
    minilm: LocalBackend, reference: dict[str, np.ndarray]
) -> None:
    items = texts(24)
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(max_batch=64, flush_timeout_s=0.01))
    await batcher.start()
    try:
        results = await asyncio.gather(*(batcher.embed([text]) for text in items))
    finally:
        await batcher.shutdown()
    assert len(recording.calls) < len(items)  # they really were batched together
    for text, rows in zip(items, results, strict=True):
        np.testing.assert_allclose(rows[0], reference[text], atol=1e-5)


async def test_a_call_gets_its_rows_in_its_own_order(
    minilm: LocalBackend, reference: dict[str, np.ndarray]
) -> None:
    items = texts(12)[::-1]  # longest first, so the sorted batch order differs from the call's
    batcher = MicroBatcher(minilm)
    await batcher.start()
    try:
        rows = await batcher.embed(items)
    finally:
        await batcher.shutdown()
    np.testing.assert_allclose(rows, [reference[text] for text in items], atol=1e-5)


async def test_an_empty_call_returns_no_rows(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.start()
    try:
        rows = await batcher.embed([])
    finally:
        await batcher.shutdown()
    assert rows.shape == (0, minilm.dim)


async def test_a_lone_surrogate_does_not_fail_the_batch(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.start()
    try:
        rows = await batcher.embed(["broken \ud800 text", "a fine neighbour"])
    finally:
        await batcher.shutdown()
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


# -- batch forming ---------------------------------------------------------------------------


async def test_a_batch_reaches_the_backend_sorted_by_length(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(max_batch=64))
    await batcher.start()
    try:
        await batcher.embed(texts(20)[::-1])
    finally:
        await batcher.shutdown()
    assert len(recording.calls) == 1
    lengths = [estimate_tokens(text) for text in recording.calls[0]]
    assert lengths == sorted(lengths)


async def test_the_token_budget_splits_batches(minilm: LocalBackend) -> None:
    items = texts(20)
    budget = 120
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(max_batch=64, max_batch_tokens=budget))
    await batcher.start()
    try:
        await batcher.embed(items)
    finally:
        await batcher.shutdown()
    assert len(recording.calls) > 1
    assert sorted(text for call in recording.calls for text in call) == sorted(items)
    for call in recording.calls:
        padded = len(call) * max(estimate_tokens(text) for text in call)
        assert padded <= budget or len(call) == 1


async def test_a_text_longer_than_the_budget_goes_alone(minilm: LocalBackend) -> None:
    long_text = "A long document about invoices. " * 40
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(max_batch_tokens=100))
    await batcher.start()
    try:
        await batcher.embed(["short one", long_text, "short two"])
    finally:
        await batcher.shutdown()
    assert [long_text] in recording.calls


async def test_max_batch_caps_the_texts_of_one_backend_call(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(max_batch=5))
    await batcher.start()
    try:
        await batcher.embed(texts(17))
    finally:
        await batcher.shutdown()
    assert max(len(call) for call in recording.calls) == 5
    assert sum(len(call) for call in recording.calls) == 17


async def test_texts_queued_while_the_backend_was_busy_go_in_one_batch(
    minilm: LocalBackend,
) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(max_batch=64))
    await batcher.start()
    try:
        busy = asyncio.create_task(batcher.embed(["in the model"]))
        await gated.entered.wait()
        waiting = [asyncio.create_task(batcher.embed([text])) for text in texts(5)]
        gated.release()
        await asyncio.gather(busy, *waiting)
    finally:
        await batcher.shutdown()
    assert sorted(gated.calls[1]) == sorted(texts(5))


async def test_a_text_every_caller_gave_up_on_is_not_embedded(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(max_batch=1))
    await batcher.start()
    try:
        busy = asyncio.create_task(batcher.embed(["in the model"]))
        await gated.entered.wait()
        abandoned = asyncio.create_task(batcher.embed(["nobody waits for this"]))
        await asyncio.sleep(0)
        abandoned.cancel()
        gated.release()
        await busy
        await batcher.embed(["after"])
    finally:
        await batcher.shutdown()
    assert ["nobody waits for this"] not in gated.calls
    assert batcher.stats().in_flight == 0


# -- cache -----------------------------------------------------------------------------------


async def test_repeated_texts_reach_the_backend_once(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, cache=Cache(100))
    await batcher.start()
    try:
        first = await batcher.embed(["You are a helpful billing assistant."])
        again = await batcher.embed(["You are a helpful billing assistant."])
    finally:
        await batcher.shutdown()
    assert len(recording.calls) == 1
    np.testing.assert_array_equal(first, again)
    assert batcher.stats().cache.hits == 1


async def test_a_text_repeated_within_a_call_is_embedded_once(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    batcher = MicroBatcher(recording)
    await batcher.start()
    try:
        rows = await batcher.embed(["same", "other", "same"])
    finally:
        await batcher.shutdown()
    assert recording.calls == [["same", "other"]]
    np.testing.assert_array_equal(rows[0], rows[2])


async def test_concurrent_callers_share_a_text_already_queued(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, Batching(flush_timeout_s=0.01))
    await batcher.start()
    try:
        await asyncio.gather(*(batcher.embed(["Shared system prompt."]) for _ in range(10)))
    finally:
        await batcher.shutdown()
    assert recording.calls == [["Shared system prompt."]]


async def test_a_shared_cache_keeps_encoders_apart(minilm: LocalBackend) -> None:
    cache = Cache(100)
    first, second = Recording(minilm), Recording(minilm)
    second.name = "another-encoder"
    batchers = [MicroBatcher(first, cache=cache), MicroBatcher(second, cache=cache)]
    for batcher in batchers:
        await batcher.start()
    try:
        for batcher in batchers:
            await batcher.embed(["the same text"])
    finally:
        for batcher in batchers:
            await batcher.shutdown()
    assert len(first.calls) == len(second.calls) == 1


# -- overload --------------------------------------------------------------------------------


async def test_a_saturated_batcher_sheds_without_blocking(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(queue_size=4, max_batch=1))
    await batcher.start()
    try:
        busy = asyncio.create_task(batcher.embed(["in the model"]))
        await gated.entered.wait()
        queued = asyncio.create_task(batcher.embed(texts(4)))
        shed = asyncio.create_task(batcher.embed(["one too many"]))
        await asyncio.sleep(0)
        # Decided on its first step, while the backend is still held: it did not wait.
        assert shed.done()
        with pytest.raises(Overloaded) as raised:
            shed.result()
        assert (raised.value.requested, raised.value.free) == (1, 0)
        gated.release()
        await asyncio.gather(busy, queued)
    finally:
        await batcher.shutdown()
    assert (batcher.stats().shed_calls, batcher.stats().shed_texts) == (1, 1)


async def test_a_call_that_does_not_fit_queues_none_of_its_texts(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(queue_size=4, max_batch=1))
    await batcher.start()
    try:
        busy = asyncio.create_task(batcher.embed(["in the model"]))
        await gated.entered.wait()
        with pytest.raises(Overloaded):
            await batcher.embed(texts(5))
        assert batcher.stats().waiting == 0
        gated.release()
        await busy
    finally:
        await batcher.shutdown()
    assert gated.calls == [["in the model"]]


# -- failures --------------------------------------------------------------------------------


async def test_a_failed_batch_fails_its_callers_with_a_backend_error(
    minilm: LocalBackend,
) -> None:
    batcher = MicroBatcher(Failing(minilm, OSError("connection reset")))
    await batcher.start()
    try:
        with pytest.raises(BackendError) as raised:
            await batcher.embed(["a text"])
    finally:
        await batcher.shutdown()
    assert isinstance(raised.value.__cause__, OSError)
    assert batcher.stats().failed_batches == 1


async def test_the_batcher_keeps_serving_after_a_failed_batch(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(Failing(minilm, OSError("once"), times=1))
    await batcher.start()
    try:
        with pytest.raises(BackendError):
            await batcher.embed(["first"])
        rows = await batcher.embed(["second"])
    finally:
        await batcher.shutdown()
    assert rows.shape == (1, minilm.dim)


async def test_a_backend_returning_the_wrong_shape_fails_the_batch(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(WrongShape(minilm))
    await batcher.start()
    try:
        with pytest.raises(BackendError, match="shape"):
            await batcher.embed(["one", "two"])
    finally:
        await batcher.shutdown()


class WorkerKiller(BaseException):
    """Not an Exception: escapes the per-batch handler and ends the worker task."""


async def test_a_dead_worker_fails_callers_and_is_reported(minilm: LocalBackend) -> None:
    reported: list[BaseException] = []
    batcher = MicroBatcher(Failing(minilm, WorkerKiller()), on_task_failure=reported.append)
    await batcher.start()
    try:
        with pytest.raises(BackendError):
            await batcher.embed(["a text"])
        with pytest.raises(BackendError, match="worker failed"):
            await batcher.embed(["a later text"])
    finally:
        await batcher.shutdown()
    assert len(reported) == 1
    assert isinstance(reported[0], WorkerKiller)


async def test_a_caller_giving_up_does_not_cancel_a_text_another_waits_for(
    minilm: LocalBackend,
) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated)
    await batcher.start()
    try:
        quitter = asyncio.create_task(batcher.embed(["shared"]))
        stayer = asyncio.create_task(batcher.embed(["shared"]))
        await gated.entered.wait()
        quitter.cancel()
        gated.release()
        rows = await stayer
    finally:
        await batcher.shutdown()
    assert quitter.cancelled()
    assert rows.shape == (1, minilm.dim)


# -- lifecycle -------------------------------------------------------------------------------


async def test_shutdown_errors_pending_callers(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(max_batch=1))
    await batcher.start()
    running = asyncio.create_task(batcher.embed(["in the model"]))
    queued = asyncio.create_task(batcher.embed(["still queued"]))
    await gated.entered.wait()
    await batcher.shutdown(timeout_s=0)
    for caller in (running, queued):
        with pytest.raises(Closed):
            await caller
    assert batcher.stats().in_flight == 0


async def test_shutdown_lets_queued_texts_finish_within_its_timeout(
    minilm: LocalBackend,
) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.start()
    caller = asyncio.create_task(batcher.embed(texts(8)))
    await asyncio.sleep(0)
    await batcher.shutdown(timeout_s=30)
    assert (await caller).shape == (8, minilm.dim)


async def test_embed_before_start_raises_closed(minilm: LocalBackend) -> None:
    with pytest.raises(Closed):
        await MicroBatcher(minilm).embed(["text"])


async def test_embed_after_shutdown_raises_closed(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.start()
    await batcher.shutdown()
    with pytest.raises(Closed):
        await batcher.embed(["text"])


async def test_shutdown_is_safe_without_start_and_twice(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.shutdown()
    await batcher.shutdown()
    with pytest.raises(Closed):
        await batcher.start()


async def test_a_fresh_batcher_on_the_same_config_starts_after_shutdown(
    minilm: LocalBackend,
) -> None:
    config = Batching(queue_size=64, max_batch=8)
    first = MicroBatcher(minilm, config)
    await first.start()
    await first.embed(["one"])
    await first.shutdown()
    second = MicroBatcher(minilm, config)
    await second.start()
    rows = await second.embed(["two"])
    await second.shutdown()
    assert rows.shape == (1, minilm.dim)


async def test_workers_do_not_keep_the_batcher_alive(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm, Batching(workers=2))
    await batcher.start()
    tasks = [task for task in asyncio.all_tasks() if task.get_name().startswith("semhealth-embed")]
    alive = weakref.ref(batcher)
    del batcher
    gc.collect()
    try:
        assert alive() is None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_an_invalid_config_is_refused_at_construction(minilm: LocalBackend) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(minilm, Batching(queue_size=4, max_batch=8))


# -- callers that give up, and the batch-cost estimate ---------------------------------------


async def test_a_caller_that_gives_up_has_none_of_its_texts_embedded(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(max_batch=4, flush_timeout_s=0.0))
    await batcher.start()
    try:
        held = asyncio.create_task(batcher.embed(texts(4, "held ")))
        await gated.entered.wait()
        mine = texts(3, "mine ")
        shared = "a text another caller wants too"
        other = asyncio.create_task(batcher.embed([shared]))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await batcher.embed([*mine, shared])
        gated.release()
        await held
        assert (await other).shape == (1, 384)
    finally:
        await batcher.shutdown()
    embedded = {text for call in gated.calls for text in call}
    assert not embedded & set(mine)  # every one of its texts, not only the one it awaited
    assert shared in embedded  # a text another caller still waits for is kept
    assert batcher.stats().expired_texts == 3


def test_batch_cost_fits_a_fixed_cost_plus_a_cost_per_text() -> None:
    cost = BatchCost()
    assert cost.seconds_for(32) is None
    for size in (4, 16, 8, 32, 12, 24) * 3:
        cost.observe(size, 0.5 + 0.01 * size)
    assert cost.seconds_for(32) == pytest.approx(0.82, rel=1e-3)
    assert cost.seconds_for(4) == pytest.approx(0.54, rel=1e-3)


def test_batch_cost_of_batches_all_one_size_is_proportional() -> None:
    cost = BatchCost()
    for _ in range(3):
        cost.observe(10, 1.0)
    assert cost.seconds_for(20) == pytest.approx(2.0)


async def test_expected_wait_counts_the_queue_in_whole_batches(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(max_batch=4, flush_timeout_s=0.0))
    await batcher.start()
    try:
        assert batcher.expected_wait_s(5) is None  # no batch to go by yet
        gated.release()
        await batcher.embed(texts(4, "first "))
        assert batcher.expected_wait_s(5) is None  # idle: a call goes straight in
        gated.gate.clear()
        held = asyncio.create_task(batcher.embed(texts(4, "held ")))
        await until_calls(gated, 2)
        queued = asyncio.create_task(batcher.embed(texts(6, "queued ")))
        await asyncio.sleep(0)
        full = batcher._shared.cost.seconds_for(4)
        assert full is not None
        # The batch in the model, then 6 queued + 5 new texts: two full batches and 3.
        wait = batcher.expected_wait_s(5)
        assert wait == pytest.approx(3 * full + batcher._shared.cost.seconds_for(3))
        stats = batcher.stats()
        assert stats.texts_per_s == pytest.approx(4 / full)
        gated.release()
        await asyncio.gather(held, queued)
    finally:
        await batcher.shutdown()


async def until_calls(gated: Gated, count: int) -> None:
    async with asyncio.timeout(5.0):
        while len(gated.calls) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
