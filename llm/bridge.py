"""Run a blocking iterator (a model's token or audio generator) in a worker thread and consume it
from asyncio through a bounded queue. Shared by the model packages (llm, tts).

Cancellation: when the consumer stops (break, aclose, task cancel) the worker sees a stop flag
before producing its next item, so a generation stops within one token.

On demand (`on_demand=True`): the worker computes an item only once the consumer has asked for
it, so a consumer that stops reading for a while also stops the computation (a language model
gives the cores back to the voice while the first audio is synthesized). Throughput is the
same as long as the consumer asks again at once, which an `async for` does.

`executor`: where the worker runs (default: the loop's default thread pool). A model whose
runtime keeps per-thread state passes its own one-thread executor (see llm/llamacpp.py).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Error:
    def __init__(self, exc: BaseException):
        self.exc = exc


async def iterate_in_thread(make_iter: Callable[[threading.Event], Iterator[T]],
                            maxsize: int = 16, on_demand: bool = False,
                            executor: Executor | None = None) -> AsyncIterator[T]:
    """Yield the items of `make_iter(stop_event)` as they are produced in a worker thread."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=maxsize)
    stop = threading.Event()
    asks = threading.Semaphore(0)  # on demand: items the consumer has asked for, not yet made

    def asked() -> bool:
        while not asks.acquire(timeout=0.1):
            if stop.is_set() or loop.is_closed():  # a closed loop: nobody will ever ask again
                return False
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
        while True:  # wait for room, but notice a stop while waiting
            try:
                fut.result(timeout=0.1)
                return True
            except TimeoutError:
                if stop.is_set():
                    fut.cancel()
                    return False
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

    worker = loop.run_in_executor(executor, work)
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
        while not queue.empty():  # unblock a worker waiting on a full queue
            queue.get_nowait()
        try:
            await asyncio.shield(worker)
        except Exception:
            pass
