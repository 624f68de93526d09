"""How long a conversation may hold its slot: an idle timeout (no one has spoken, no bot audio
has gone out, for `idle_s`) and a maximum call length (`max_call_s`). Without them a caller that
says hello and then nothing holds a slot for as long as it keeps its connection open.

`Holding` is Sans-I/O: it is told what happened (`heard`, `engaged`) with a clock reading and
says whether a limit has passed (`expired`) and when to look again (`due`). `HeldTransport`
passes a conversation's transport through and tells a `Holding` what goes by: bot audio, and
the session's own state events (the user speaking, a reply being thought of or played). The
server's watchdog (agent/serving/server.py) ends the conversation with `Session.hang_up`, so a page is
told why and a phone hears a goodbye.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from transport.base import AudioOut, PassThrough, Transport
from transport.events import FinalTranscript, PartialTranscript, SessionEvent, StateChanged

IDLE_GOODBYE = "I haven't heard anything for a while, so I'll end our call now. Goodbye."
TOO_LONG_GOODBYE = "Sorry, this call has reached its time limit. Goodbye."


@dataclass(frozen=True)
class HoldingPolicy:
    idle_s: float | None = 60.0  # None or 0: no idle timeout
    max_call_s: float | None = 3600.0  # None or 0: no limit


@dataclass(frozen=True)
class Expired:
    code: str
    message: str  # what a page shows
    spoken: str  # what a phone hears


class Holding:
    def __init__(self, policy: HoldingPolicy, now: float):
        self.policy = policy
        self.started = self.last_activity = now
        self.busy = False  # the user is speaking, or a reply is on its way or playing

    def heard(self, now: float) -> None:
        """Something happened: user speech, a transcript, bot audio."""
        self.last_activity = now

    def engaged(self, busy: bool, now: float) -> None:
        """The conversation's state: while it is busy, the idle clock does not run."""
        self.busy = busy
        self.last_activity = now

    def expired(self, now: float) -> Expired | None:
        p = self.policy
        if p.max_call_s and now - self.started >= p.max_call_s:
            return Expired("call_too_long", f"the call reached its limit of {p.max_call_s:g} s",
                           TOO_LONG_GOODBYE)
        if p.idle_s and not self.busy and now - self.last_activity >= p.idle_s:
            return Expired("idle_timeout", f"no one spoke for {p.idle_s:g} s", IDLE_GOODBYE)
        return None

    def due(self, now: float) -> float | None:
        """Seconds until a limit could next pass, or None if none is set."""
        p, waits = self.policy, []
        if p.max_call_s:
            waits.append(self.started + p.max_call_s - now)
        if p.idle_s:
            waits.append(self.last_activity + p.idle_s - now if not self.busy else p.idle_s)
        return max(0.0, min(waits)) if waits else None


class HeldTransport(PassThrough):
    """A conversation's transport, passed through, telling `holding` what goes by."""

    def __init__(self, inner: Transport, holding: Holding, clock: Callable[[], float] | None = None):
        super().__init__(inner)
        self.holding, self.clock = holding, clock or time.monotonic  # read when made: a test's clock too

    async def send_audio(self, chunk: AudioOut) -> None:
        self.holding.heard(self.clock())
        await self.inner.send_audio(chunk)

    async def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, StateChanged):
            self.holding.engaged(event.busy or event.state != "listening", self.clock())
        elif isinstance(event, (PartialTranscript, FinalTranscript)):
            self.holding.heard(self.clock())
        await self.inner.send_event(event)
