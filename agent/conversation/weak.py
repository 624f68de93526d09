"""Callbacks from a conversation's parts to their owner that do not keep the owner alive: the
session holds its listener, replies and history, and they call back into it; with strong
references that is a cycle, and only the cyclic collector would free a finished conversation.
Weak ones let reference counting free it the moment its last reference goes."""
from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable


def weak_call(method: Callable, gone: Callable[[], object] = lambda: None) -> Callable:
    """`method` (a bound method) called while its object lives; once it is gone, `gone()` (None)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        bound = ref()
        return gone() if bound is None else bound(*args, **kwargs)

    return call


async def _nothing() -> None:
    return None


def weak_async(method: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
    """`weak_call` for a coroutine method: once the object is gone, awaiting a call does nothing."""
    return weak_call(method, gone=_nothing)
