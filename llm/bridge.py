"""Run a blocking iterator (a model's token or audio generator) in a worker thread and consume it
from asyncio through a bounded queue. Shared by the model packages (llm, tts).

Cancellation: when the consumer stops (break, aclose, task cancel) the worker sees a stop flag
before producing its next item, so a generation stops within one token. A stream closed while
its worker still waits for the executor (a one-thread executor busy with another stream: a
paused reply holds the model's thread) is dropped from the executor's queue, not waited for.

On demand (`on_demand=True`): the worker computes an item only once the consumer has asked for
it, so a consumer that stops reading for a while also stops the computation (a language model
gives the cores back to the voice while the first audio is synthesized). Throughput is the
same as long as the consumer asks again at once, which an `async for` does.

`executor`: where the worker runs (default: a small pool of this module's, never asyncio's
default executor, which every `to_thread` of the process shares). A model whose runtime keeps
per-thread state passes its own one-thread executor (see llm/llamacpp.py).

Abandonment: a reader that neither reads nor closes the stream for `abandon_after_s` (a
conversation gone without closing what it held) loses it: the worker stops, closes its
generator (a model's lock is released) and leaves an `AbandonedStream` error for a reader that
comes back. No worker waits forever on a reader, so no later conversation waits on that worker.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_DONE = object()
_POOL = ThreadPoolExecutor(4, thread_name_prefix="duplex-bridge")
ABANDON_AFTER_S = 30.0  # far above any wait of a live reader (a held speculation waits ~1-2 s)


class AbandonedStream(RuntimeError):
    """The stream was not read for too long, and its worker stopped."""


class _Error:
    def __init__(self, exc: BaseException):
        self.exc = exc


async def iterate_in_thread(make_iter: Callable[[threading.Event], Iterator[T]],
                            maxsize: int = 16, on_demand: bool = False,
                            executor: Executor | None = None,
                            abandon_after_s: float = ABANDON_AFTER_S) -> AsyncIterator[T]:
    """Yield the items of `make_iter(stop_event)` as they are produced in a worker thread."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=maxsize)
    stop = threading.Event()
    asks = threading.Semaphore(0)  # on demand: items the consumer has asked for, not yet made

    def abandon() -> None:
        """On the loop: the reader is gone; what it left unread is dropped for the error."""
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(_Error(AbandonedStream(f"not read for {abandon_after_s:.0f} s; its worker stopped")))

    def give_up() -> bool:
        stop.set()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(abandon)
        return False

    def asked() -> bool:
        deadline = time.monotonic() + abandon_after_s
        while not asks.acquire(timeout=0.1):
            if stop.is_set() or loop.is_closed():  # a closed loop: nobody will ever ask again
                return False
            if time.monotonic() > deadline:
                return give_up()
        return not stop.is_set()

    def put(item) -> bool:
        if stop.is_set() or loop.is_closed():
            return False
        coro = queue.put(item)
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop closed meanwhile
            coro.close()
            return False
        deadline = time.monotonic() + abandon_after_s
        while True:  # wait for room, but notice a stop (or a reader long gone) while waiting
            try:
                fut.result(timeout=0.1)
                return True
            except TimeoutError:
                if stop.is_set() or time.monotonic() > deadline:
                    fut.cancel()
                    return False if stop.is_set() else give_up()
            except (asyncio.CancelledError, RuntimeError):
                return False

    def work() -> None:
        items = None
        try:
            items = iter(make_iter(stop))
            while not on_demand or asked():
                item = next(items, _DONE)
                if item is _DONE:
                    break
                if not put(item):
                    return
        except BaseException as exc:  # hand the error to the consumer
            put(_Error(exc))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a generator releases what it holds (a model lock) here, not at GC
        put(_DONE)

    job = (executor or _POOL).submit(work)
    worker = asyncio.wrap_future(job, loop=loop)
    try:
        while True:
            if on_demand:
                asks.release()
            item = await queue.get()
            if item is _DONE:
                break
            if isinstance(item, _Error):
                raise item.exc
            yield item
    finally:
        stop.set()
        # a worker still queued behind another stream's (a paused reply's) never runs: nothing to wait for
        if not job.cancel():
            while not queue.empty():  # unblock a worker waiting on a full queue
                queue.get_nowait()
            try:
                await asyncio.shield(worker)
            except Exception:
                pass
