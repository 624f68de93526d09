"""The transport vocabulary: what crosses the edge of a session, in both directions.

Transports turn a wire (browser WebSocket, phone media stream, WAV file, sound card) into these
events and back. They know nothing about the agent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from transport.events import SessionEvent


@dataclass(frozen=True)
class AudioIn:
    pcm: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int


@dataclass(frozen=True)
class Played:
    """The far end started (or finished) playing the audio chunk `chunk_id`."""

    chunk_id: int
    event: str  # "start" | "end"
    server_time: float | None = None  # time.perf_counter() on the server clock, if known


@dataclass(frozen=True)
class ClientEvent:
    """Anything else the far end reports (ping, dtmf, speech end measured in the page, ...)."""

    kind: str
    data: dict = field(default_factory=dict)


InputEvent = AudioIn | Played | ClientEvent


class ProtocolError(ValueError):
    """A message from the far end that breaks its wire format; `code` names the rule broken.
    Transports answer or log it and go on: one bad message never ends a session."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AudioOut:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    chunk_id: int
    text: str = ""  # the words this audio speaks


class Transport(Protocol):
    reports_playout: bool  # True when Played events come back from the far end

    async def receive(self) -> InputEvent | None:
        """Next input event; None once the far end has gone."""

    async def send_audio(self, chunk: AudioOut) -> None: ...

    async def clear(self) -> None:
        """Drop every buffered, unplayed sample at the far end (barge-in)."""

    async def send_event(self, event: SessionEvent) -> None:
        """UI and diagnostic events (partials, bot text, latency); ignored where meaningless."""


class PassThrough:
    """A transport wrapped: every call goes to `inner` (and any other attribute is `inner`'s); a
    subclass overrides the calls it watches or changes."""

    def __init__(self, inner: Transport):
        self.inner = inner
        self.reports_playout = inner.reports_playout

    def __getattr__(self, name: str):  # kind, input_sample_rate, abnormal_end, ... of the inner one
        return getattr(self.inner, name)

    async def receive(self) -> InputEvent | None:
        return await self.inner.receive()

    async def send_audio(self, chunk: AudioOut) -> None:
        await self.inner.send_audio(chunk)

    async def clear(self) -> None:
        await self.inner.clear()

    async def send_event(self, event: SessionEvent) -> None:
        await self.inner.send_event(event)

