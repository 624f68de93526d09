"""Vonage Voice API WebSockets, Sans-I/O: a call connected by the NCCO
`{"action": "connect", "endpoint": [{"type": "websocket", "uri": "wss://host/vonage",
"content-type": "audio/l16;rate=16000", "headers": {...}}]}`.

Unlike the Twilio family, audio travels as binary frames and only control is JSON:

Vonage -> us
  text   {"event": "websocket:connected", "content-type": "audio/l16;rate=16000", <the NCCO's
          headers, flattened>}                                    first, once
  binary 20 ms of 16-bit little-endian mono PCM at that rate (640 bytes at 16 kHz)
  text   {"event": "websocket:dtmf", "digit": "5", "duration": 260}
  text   {"event": "websocket:notify", "payload": {...}}          a notify we sent was reached
  text   {"event": "websocket:cleared"}                           our clear was done
us -> Vonage
  binary 20 ms frames in the same format (Vonage wants exactly 20 ms a message; it buffers
         what comes early, up to 20-60 s by its docs' various figures)
  text   {"action": "notify", "payload": {"mark": N}}    echoed as websocket:notify once the audio
                                                         before it has played
  text   {"action": "clear"}                             drop all queued audio (barge-in)

The call ends when the socket closes: Vonage sends no stop message. Rates: 8, 16 or 24 kHz.
Marks work as in `media_streams`: a notify before each reply piece ("s<id>") and one after it
("e<id>"), and after a clear, late notifies are ignored (Vonage does not say whether it sends
back the ones it dropped).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from transport.audio import int16_to_float
from transport.base import AudioIn, ClientEvent, InputEvent, ProtocolError
from transport.telephony.marks import PlayoutMarks
from transport.wire import json_object

RATES = (8000, 16000, 24000)
MAX_TEXT_CHARS = 16 * 1024  # the connected message carries the NCCO's headers (Vonage caps them at 2 KB)
MAX_AUDIO_BYTES = 48000  # 1 s at 24 kHz in one frame; Vonage sends 20 ms
DTMF_DIGITS = set("0123456789*#ABCDabcd")
CLEAR = json.dumps({"action": "clear"})


@dataclass(frozen=True)
class Connected:
    rate: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Notified:
    mark: str | None  # None: a notify that is not one of our marks


@dataclass(frozen=True)
class Dtmf:
    digit: str


def content_type_rate(value) -> int:
    """The rate of "audio/l16;rate=16000", or ProtocolError if it is not a format we speak."""
    m = re.fullmatch(r"\s*audio/l16\s*;\s*rate\s*=\s*(\d{4,5})\s*", value, re.IGNORECASE) if isinstance(value, str) else None
    if m is None or int(m.group(1)) not in RATES:
        raise ProtocolError("unsupported_format", f"content-type {str(value)[:60]!r}: Vonage streams are spoken "
                                                  f"as audio/l16 at {' or '.join(map(str, RATES))} Hz")
    return int(m.group(1))


def parse_text(message: str) -> Connected | Notified | Dtmf | None:
    """One JSON control message from Vonage (None: nothing for us), or ProtocolError."""
    msg = json_object(message, MAX_TEXT_CHARS, "event")
    event = msg["event"]
    if event == "websocket:connected":
        headers = {str(k)[:64]: str(v)[:256] for k, v in list(msg.items())[:64]
                   if k not in ("event", "content-type") and isinstance(v, (str, int, float)) and not isinstance(v, bool)}
        return Connected(content_type_rate(msg.get("content-type")), dict(list(headers.items())[:32]))
    if event == "websocket:dtmf":
        nested = msg.get("dtmf")
        digit = msg.get("digit", nested.get("digit") if isinstance(nested, dict) else None)
        if not isinstance(digit, str) or digit not in DTMF_DIGITS:
            raise ProtocolError("bad_message", f"websocket:dtmf needs one digit, not {str(digit)[:8]!r}")
        return Dtmf(digit)
    if event == "websocket:notify":
        payload = msg.get("payload")
        if not isinstance(payload, dict):
            raise ProtocolError("bad_message", "websocket:notify needs a 'payload' object")
        mark = payload.get("mark")
        return Notified(mark if isinstance(mark, str) else None)
    if event == "websocket:cleared":
        return None
    raise ProtocolError("unknown_event", f"unknown event {event[:40]!r}")


def notify_message(mark: str) -> str:
    return json.dumps({"action": "notify", "payload": {"mark": mark}})


def audio_frames(pcm16: np.ndarray, rate: int) -> list[bytes]:
    """int16 samples -> binary messages of exactly 20 ms each (the last padded with silence)."""
    n = rate // 50
    pcm = np.asarray(pcm16, dtype="<i2")
    if pcm.size % n:
        pcm = np.concatenate([pcm, np.zeros(n - pcm.size % n, "<i2")])
    return [pcm[i:i + n].tobytes() for i in range(0, pcm.size, n)]


class VonageCall:
    """One Vonage WebSocket call's state, with no I/O: messages in, events and messages out."""

    name = "vonage"

    def __init__(self) -> None:
        self.connected: Connected | None = None
        self.marks = PlayoutMarks()
        self.dropped_audio = 0  # pieces before websocket:connected said the rate

    @property
    def rate(self) -> int | None:
        return self.connected.rate if self.connected else None

    @property
    def stream_sid(self) -> str | None:
        """Vonage names no stream; the NCCO's headers may carry the call's uuid."""
        return self.connected.headers.get("uuid") if self.connected else None

    def receive(self, message: str | bytes, now: float | None = None) -> InputEvent | None:
        """One message -> an input event, or None when it carries none; ProtocolError if bad."""
        if isinstance(message, bytes):
            if self.connected is None:
                raise ProtocolError("no_start", "audio before websocket:connected")
            if len(message) % 2 or len(message) > MAX_AUDIO_BYTES:
                raise ProtocolError("bad_audio", f"an audio frame of {len(message)} bytes (16-bit samples, "
                                                 f"at most {MAX_AUDIO_BYTES} bytes)")
            return AudioIn(int16_to_float(np.frombuffer(message, "<i2").astype(np.int16)), self.connected.rate)
        ev = parse_text(message)
        if isinstance(ev, Connected):
            self.connected = ev
            return ClientEvent("call_start", {f"param_{k}": v for k, v in ev.headers.items()})
        if isinstance(ev, Notified):
            return self.marks.reached(ev.mark, now)
        if isinstance(ev, Dtmf):
            return ClientEvent("dtmf", {"digit": ev.digit})
        return None

    def audio(self, chunk_id: int, pcm16: np.ndarray) -> list[str | bytes]:
        """Messages that queue one piece of int16 audio at the call's rate, between two notifies."""
        if self.connected is None:
            self.dropped_audio += 1
            return []
        start, end = self.marks.around(chunk_id)
        return [notify_message(start), *audio_frames(pcm16, self.connected.rate), notify_message(end)]

    def clear(self) -> list[str | bytes]:
        """Drop everything queued at Vonage; its notifies never count as played."""
        self.marks.clear()
        return [CLEAR] if self.connected else []
