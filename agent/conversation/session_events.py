"""What a program can follow in a live conversation: typed events, and the bus that delivers them.

    @session.on(ToolCallFinished)
    def log_tool(ev: ToolCallFinished) -> None: ...

A handler is a function or a coroutine function. Sync handlers run at once, on the loop (keep
them short); async ones run as tasks of the bus, which the session cancels when it ends. A
handler's error is logged and never reaches the conversation.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("duplex.events")


@dataclass(frozen=True)
class UserTurnFinal:
    turn: int
    text: str


@dataclass(frozen=True)
class ReplyStarted:
    """The reply's first audio is going out."""

    turn: int
    speculative: bool


@dataclass(frozen=True)
class ReplyFinished:
    turn: int
    heard: str  # the words the user heard
    interrupted: bool
    error: str | None = None


@dataclass(frozen=True)
class ToolCallStarted:
    turn: int
    call_id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolCallFinished:
    turn: int
    call_id: str
    name: str
    status: str  # "ok" | "error" (failed, timed out, bad arguments) | "cancelled"
    result: str


@dataclass(frozen=True)
class BargeIn:
    """The user's words cut the reply of `turn`; `heard` is what they heard of it."""

    turn: int
    heard: str


@dataclass(frozen=True)
class DtmfReceived:
    """The caller pressed a key (phone transports that carry DTMF: Twilio, Telnyx, Vonage, AudioSocket)."""

    digit: str


@dataclass(frozen=True)
class SessionEnded:
    reason: str
    records: tuple = ()  # agent.conversation.records.TurnRecord, the turns kept


class EventBus:
    def __init__(self, max_tasks: int = 64) -> None:
        self._handlers: dict[type, list[Callable]] = defaultdict(list)
        self._tasks: set[asyncio.Task] = set()
        self.max_tasks = max_tasks  # handlers that never end cannot pile up without bound

    def on(self, kind: type, handler: Callable | None = None):
        """Subscribe `handler` to events of type `kind`; as a decorator without `handler`."""
        def add(fn: Callable) -> Callable:
            self._handlers[kind].append(fn)
            return fn

        return add(handler) if handler is not None else add

    def emit(self, event: Any) -> None:
        for handler in self._handlers.get(type(event), ()):
            try:
                if inspect.iscoroutinefunction(handler):
                    if len(self._tasks) >= self.max_tasks:
                        log.warning("event %s dropped for %s: %d handlers still running", type(event).__name__,
                                    getattr(handler, "__name__", handler), len(self._tasks))
                        continue
                    task = asyncio.get_running_loop().create_task(self._guarded(handler, event))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    handler(event)
            except Exception:  # noqa: BLE001 - the integrator's bug is not the caller's
                log.exception("event handler %s failed on %s", getattr(handler, "__name__", handler), event)

    @staticmethod
    async def _guarded(handler: Callable, event: Any) -> None:
        try:
            await handler(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("event handler %s failed on %s", getattr(handler, "__name__", handler), event)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        self._handlers.clear()
