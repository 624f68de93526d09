"""asyncio shell for phone media streams over a WebSocket (Twilio, Telnyx, Plivo, Exotel, Vonage):
one WebSocket as a `Transport`.

The wire formats and the mark bookkeeping live in the Sans-I/O calls
(`media_streams.MediaStreamCall`, `vonage.VonageCall`); this only moves messages. The far end
reads no error messages, so a bad one is logged, counted and skipped: the call goes on.
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

from transport.audio import Int16RateAdapter
from transport.base import AudioOut, InputEvent, ProtocolError
from transport.events import SessionEvent
from transport.telephony.media_streams import CallEnded
from transport.websocket_io import abnormal_close, recv_or_none, send_all
from transport.wire import BadInput

log = logging.getLogger("duplex.phone")


class PhoneStreamCall(Protocol):
    """What the shell needs of a Sans-I/O call."""

    name: str
    rate: int | None  # the stream's sample rate, once the far end has said it
    stream_sid: str | None

    def receive(self, message: str | bytes, now: float | None = None) -> InputEvent | None:
        """Raises ProtocolError for a bad message, CallEnded when the far end ends the call."""

    def audio(self, chunk_id: int, pcm16) -> list[str | bytes]: ...

    def clear(self) -> list[str | bytes]: ...


class MediaStreamTransport:
    reports_playout = True  # from the marks the far end echoes back

    @property
    def kind(self) -> str:
        """The carrier's name (twilio, telnyx, ...): names the conversation in logs and metrics."""
        return self.call.name

    def __init__(self, ws, call: PhoneStreamCall) -> None:
        self.ws = ws
        self.call = call
        self._to_stream_rate: Int16RateAdapter | None = None  # made once the far end names the rate
        self.bad_input = BadInput(log, f"{call.name} stream")

    async def receive(self) -> InputEvent | None:
        while True:
            message = await recv_or_none(self.ws)
            if message is None:
                return None
            try:
                event = self.call.receive(message, time.perf_counter())
            except CallEnded:
                return None
            except ProtocolError as exc:
                self.bad_input(exc, self.call.stream_sid)
                continue
            if event is not None:
                return event

    async def send_audio(self, chunk: AudioOut) -> None:
        rate = self.call.rate
        if rate is None:  # no stream yet: the call drops (and counts) it
            await send_all(self.ws, *self.call.audio(chunk.chunk_id, chunk.pcm))
            return
        if self._to_stream_rate is None or self._to_stream_rate.out_rate != rate:
            self._to_stream_rate = Int16RateAdapter(rate)
        await send_all(self.ws, *self.call.audio(chunk.chunk_id, self._to_stream_rate(chunk.pcm, chunk.sample_rate)))

    async def clear(self) -> None:
        await send_all(self.ws, *self.call.clear())

    async def send_event(self, event: SessionEvent) -> None:
        """A phone has no screen: UI events go nowhere."""

    def abnormal_end(self) -> str | None:
        """Why the carrier's stream was lost (no close frame, a keepalive timeout), or None."""
        return abnormal_close(self.ws)
