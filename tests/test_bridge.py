"""llm.bridge: a blocking generator consumed from asyncio through a bounded queue."""
import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from llm.bridge import iterate_in_thread


def counting(made: list[int], n: int = 50):
    def make(stop: threading.Event):
        for i in range(n):
            made.append(i)
            yield i
    return make


async def _read_one_then_wait(on_demand: bool) -> list[int]:
    made: list[int] = []
    async with contextlib.aclosing(iterate_in_thread(counting(made), maxsize=4, on_demand=on_demand)) as items:
        assert await anext(items) == 0
        await asyncio.sleep(0.3)  # the reader is busy (the session: synthesizing the first audio)
        seen = list(made)
        assert [x async for x in items] == list(range(1, 50))  # nothing lost either way
    return seen


async def test_on_demand_computes_nothing_the_reader_has_not_asked_for():
    assert await _read_one_then_wait(on_demand=True) == [0]


async def test_without_on_demand_the_worker_runs_ahead_to_fill_the_queue():
    # the contrast: a plain bounded queue lets the producer run up to maxsize (+1 in hand) ahead
    assert len(await _read_one_then_wait(on_demand=False)) >= 5


async def test_closing_early_stops_the_worker_and_closes_its_generator():
    closed = threading.Event()

    def gen(stop):
        try:
            for i in range(1000):
                yield i
        finally:
            closed.set()
    async with contextlib.aclosing(iterate_in_thread(gen, maxsize=2, on_demand=True)) as items:
        async for x in items:
            if x == 3:
                break
    assert closed.wait(2.0)


# the never-closed async generator is reported when collected: that is the scenario
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_worker_left_waiting_by_a_closed_loop_ends():
    """A reader whose event loop is closed without closing the stream (an abrupt exit) must not
    leave the worker waiting for a request forever: the process would hang at exit joining it."""
    closed = threading.Event()

    def gen(stop):
        try:
            yield from range(1000)
        finally:
            closed.set()

    pool = ThreadPoolExecutor(1)
    loop = asyncio.new_event_loop()
    items = iterate_in_thread(gen, maxsize=2, on_demand=True, executor=pool)
    assert loop.run_until_complete(anext(items)) == 0
    loop.close()  # the stream is never closed
    assert closed.wait(2.0), "the worker is still waiting for its reader"
    pool.shutdown(wait=True)


@pytest.mark.parametrize("on_demand", [True, False])
async def test_a_reader_that_neither_reads_nor_closes_loses_the_stream(on_demand):
    """The wedge of issue 17: a conversation gone without closing its LLM stream left the one
    model thread waiting for it forever, holding the model, and every later conversation
    waited behind it. Now the worker gives up, releases what it holds, and a reader that comes
    back hears why."""
    from llm.bridge import AbandonedStream

    lock = threading.Lock()

    def gen(stop):
        with lock:  # what a model holds while it generates
            yield from range(1000)

    pool = ThreadPoolExecutor(1)
    items = iterate_in_thread(gen, maxsize=2, on_demand=on_demand, executor=pool, abandon_after_s=0.3)
    assert await anext(items) == 0
    # the reader keeps the stream but never reads again: the worker must let go of the lock
    assert await asyncio.to_thread(lock.acquire, True, 5.0), "the worker still holds the model"
    lock.release()
    # the pool's one thread is free again: the next stream runs
    async with contextlib.aclosing(iterate_in_thread(gen, maxsize=2, on_demand=on_demand, executor=pool)) as fresh:
        assert await anext(fresh) == 0
    with pytest.raises(AbandonedStream):
        async for _ in items:
            pass
    pool.shutdown(wait=True)


async def test_a_stream_closed_before_its_worker_started_is_not_waited_for():
    """One model thread: a paused reply's stream holds it (on demand, not read); a second
    stream queued behind it and closed (a speculation cancelled) returns at once, and its
    generator never runs, instead of waiting until the first stream is given up on."""
    one = ThreadPoolExecutor(1)
    started = threading.Event()

    def second(stop):
        started.set()
        yield 1

    async with contextlib.aclosing(iterate_in_thread(counting([]), maxsize=2, on_demand=True, executor=one)) as paused:
        assert await anext(paused) == 0  # its worker now waits for the next ask, on the only thread
        queued = iterate_in_thread(second, maxsize=2, on_demand=True, executor=one)
        reader = asyncio.ensure_future(anext(queued))
        await asyncio.sleep(0.1)
        reader.cancel()  # the session cancels the speculation: its reader ends, and its stream
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reader), 1.0)
        assert not started.is_set()
    one.shutdown(wait=True)
