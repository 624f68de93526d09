"""asyncio shell for Twilio-style media streams (Twilio, Telnyx, Plivo, Exotel): one WebSocket as
a `Transport`.

The wire format and the mark bookkeeping live in `transport.telephony.media_streams` (Sans-I/O);
this only moves messages. The far end reads no error messages, so a bad one is logged, counted
and skipped: the call goes on.
"""
from __future__ import annotations

import logging
import time

from transport.audio import Int16RateAdapter
from transport.base import AudioOut, InputEvent, ProtocolError
from transport.telephony.media_streams import TWILIO, CallEnded, Dialect, MediaStreamCall
from transport.websocket_io import recv_or_none, send_all
from transport.wire import BadInput

log = logging.getLogger("duplex.phone")


class MediaStreamTransport:
    reports_playout = True  # from the marks the far end echoes back

    def __init__(self, ws, dialect: Dialect = TWILIO) -> None:
        self.ws = ws
        self.call = MediaStreamCall(dialect)
        self._to_stream_rate: Int16RateAdapter | None = None  # made once `start` names the rate
        self.bad_input = BadInput(log, f"{dialect.name} stream")

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

    async def send_event(self, event: dict) -> None:
        """A phone has no screen: UI events go nowhere."""
