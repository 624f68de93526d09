"""Run a blocking iterator (a model's token or audio generator) in a worker thread and consume it
from asyncio through a bounded queue. Shared by the model packages (llm, tts).

Cancellation: when the consumer stops (break, aclose, task cancel) the worker sees a stop flag
before producing its next item, so a generation stops within one token.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Error:
    def __init__(self, exc: BaseException):
        self.exc = exc


async def iterate_in_thread(make_iter: Callable[[threading.Event], Iterator[T]],
                            maxsize: int = 16) -> AsyncIterator[T]:
    """Yield the items of `make_iter(stop_event)` as they are produced in a worker thread."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=maxsize)
    stop = threading.Event()

    def put(item) -> bool:
        if stop.is_set():
            return False
        fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
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
        try:
            for item in make_iter(stop):
                if not put(item):
                    break
        except BaseException as exc:  # hand the error to the consumer
            put(_Error(exc))
            return
        put(_DONE)

    worker = loop.run_in_executor(None, work)
    try:
        while True:
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
