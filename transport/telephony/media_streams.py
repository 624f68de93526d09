"""Twilio-style bidirectional media streams over a WebSocket, Sans-I/O: Twilio Media Streams
(`<Connect><Stream url="wss://host/twilio"/>`) and Telnyx Media Streaming (the same protocol with
snake_case names; `stream_url=wss://host/telnyx`, `stream_bidirectional_mode=rtp`).

Wire format, Twilio's names (JSON text frames; what Twilio documents and pipecat's
`TwilioFrameSerializer` speaks):

Twilio -> us
  {"event": "connected", "protocol": "Call", "version": "1.0.0"}
  {"event": "start", "streamSid": S, "start": {"streamSid": S, "callSid": C, "accountSid": A,
      "tracks": ["inbound"], "customParameters": {...},
      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}
  {"event": "media", "streamSid": S, "media": {"track": "inbound", "chunk": "2",
      "timestamp": "40", "payload": base64 of 8 kHz mu-law (160 bytes = 20 ms)}}
  {"event": "dtmf", "streamSid": S, "dtmf": {"track": "inbound_track", "digit": "5"}}
  {"event": "mark", "streamSid": S, "mark": {"name": N}}    a mark we sent has been reached
  {"event": "stop", "streamSid": S, "stop": {"callSid": C, "accountSid": A}}
us -> Twilio
  {"event": "media", "streamSid": S, "media": {"payload": base64 mu-law}}   queued for playback
  {"event": "mark", "streamSid": S, "mark": {"name": N}}    echoed back once the audio before it played
  {"event": "clear", "streamSid": S}                        drop all queued audio (barge-in)

Telnyx says "stream_id", "call_control_id", "custom_parameters" and "media_format" {"encoding":
"PCMU" | "PCMA", "sample_rate": 8000, "channels": 1}; its marks and `clear` behave as Twilio's
(a `clear` hands back the queued marks).

The far end buffers everything sent to it and plays it in order, so what the caller heard is
known only from marks. `MediaStreamCall` puts a mark before each audio piece ("s<id>": the piece
starts) and one after it ("e<id>": it ended), and turns their echoes into `Played` events. After
a `clear`, echoes of the marks that were queued are ignored: that audio was never played. The
echoes do not say which marks were reached and which were cleared, so an echo still on the wire
when we send `clear` is dropped with them (the caller heard at most one network round trip more
than we count).
"""
from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from transport.audio import int16_to_float
from transport.base import AudioIn, ClientEvent, InputEvent, Played, ProtocolError
from transport.telephony.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from transport.wire import json_object

RATE = 8000
MAX_MESSAGE_CHARS = 64 * 1024
MAX_PAYLOAD_BYTES = 8000  # 1 s of audio in one message; Twilio sends 20 ms (160 bytes)
MAX_PENDING_MARKS = 1024  # a peer that never echoes marks cannot grow our memory
DTMF_DIGITS = set("0123456789*#ABCDabcd")


class Codec(NamedTuple):
    decode: Callable[[bytes], np.ndarray]  # wire bytes -> int16 samples
    encode: Callable[[np.ndarray], bytes]


ULAW, ALAW = Codec(ulaw_decode, ulaw_encode), Codec(alaw_decode, alaw_encode)


@dataclass(frozen=True)
class Dialect:
    """The names one provider gives the same protocol."""

    name: str
    stream_id: str  # key of the stream's id, in `start` and in every message we send
    call_id: str
    format: str  # key of the media format object in `start`
    rate: str
    params: str
    encodings: dict[str, Codec]  # by wire name
    default_encoding: str
    addressed: bool = True  # our messages carry the stream's id (Twilio needs it, Telnyx's omit it)


TWILIO = Dialect("twilio", "streamSid", "callSid", "mediaFormat", "sampleRate", "customParameters",
                 {"audio/x-mulaw": ULAW, "audio/x-alaw": ALAW}, "audio/x-mulaw")
TELNYX = Dialect("telnyx", "stream_id", "call_control_id", "media_format", "sample_rate", "custom_parameters",
                 {"PCMU": ULAW, "PCMA": ALAW}, "PCMU", addressed=False)


@dataclass(frozen=True)
class Connected:
    protocol: str


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str = ""
    account_sid: str = ""
    tracks: tuple[str, ...] = ("inbound",)
    custom_parameters: dict = field(default_factory=dict)
    encoding: str = "audio/x-mulaw"  # the only rate and layout spoken: 8000 Hz mono


@dataclass(frozen=True)
class Media:
    payload: bytes  # G.711 bytes as sent
    track: str = "inbound"


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Stop:
    call_sid: str = ""


StreamEvent = Connected | Start | Media | Mark | Dtmf | Stop


def _obj(msg: dict, key: str) -> dict:
    value = msg.get(key)
    if not isinstance(value, dict):
        raise ProtocolError("bad_message", f"'{msg.get('event')}' message needs a '{key}' object")
    return value


def _str(obj: dict, key: str, default: str | None = None, limit: int = 256) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError("bad_message", f"'{key}' must be a string of at most {limit} characters")
    return value


def parse_message(message: str | bytes, dialect: Dialect = TWILIO) -> StreamEvent:
    """Decode one message from the far end, or raise ProtocolError saying what is wrong with it."""
    if not isinstance(message, str):
        raise ProtocolError("bad_message", f"{dialect.name} sends JSON text frames, not binary ones")
    msg = json_object(message, MAX_MESSAGE_CHARS, "event")
    event = msg["event"]
    if event == "connected":
        return Connected(_str(msg, "protocol", ""))
    if event == "start":
        d = dialect
        start = _obj(msg, "start")
        sid = _str(start, d.stream_id, msg.get(d.stream_id))
        fmt = start.get(d.format, {})
        if not isinstance(fmt, dict):
            raise ProtocolError("bad_message", f"'{d.format}' must be an object")
        rate, channels = fmt.get(d.rate, RATE), fmt.get("channels", 1)
        encoding = _str(fmt, "encoding", d.default_encoding)
        if encoding not in d.encodings or rate != RATE or channels != 1:
            raise ProtocolError("unsupported_format",
                                f"media format {encoding} {rate!r} Hz x{channels!r}: only 8000 Hz mono "
                                f"{' or '.join(sorted(d.encodings))} is spoken")
        tracks = start.get("tracks", ["inbound"])
        params = start.get(d.params, {})
        if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks) or not isinstance(params, dict):
            raise ProtocolError("bad_message", f"'tracks' must be a list of strings, '{d.params}' an object")
        return Start(sid, _str(start, d.call_id, ""), _str(start, "accountSid", ""), tuple(tracks[:4]),
                     {str(k)[:64]: v for k, v in list(params.items())[:32] if isinstance(v, str)}, encoding)
    if event == "media":
        media = _obj(msg, "media")
        payload = _str(media, "payload", limit=MAX_PAYLOAD_BYTES * 4 // 3 + 4)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("bad_audio", "media payload is not valid base64") from None
        return Media(data, _str(media, "track", "inbound"))
    if event == "mark":
        return Mark(_str(_obj(msg, "mark"), "name"))
    if event == "dtmf":
        digit = _str(_obj(msg, "dtmf"), "digit")
        if digit not in DTMF_DIGITS:
            raise ProtocolError("bad_message", f"unknown DTMF digit {digit[:8]!r}")
        return Dtmf(digit)
    if event == "stop":
        stop = msg.get("stop", {})
        return Stop(_str(stop, dialect.call_id, "") if isinstance(stop, dict) else "")
    raise ProtocolError("unknown_event", f"unknown event {event[:40]!r}")


def _outbound(event: str, stream_sid: str, dialect: Dialect, **body) -> str:
    return json.dumps({"event": event, **({dialect.stream_id: stream_sid} if dialect.addressed else {}), **body})


def media_message(stream_sid: str, payload: bytes, dialect: Dialect = TWILIO) -> str:
    return _outbound("media", stream_sid, dialect, media={"payload": base64.b64encode(payload).decode("ascii")})


def mark_message(stream_sid: str, name: str, dialect: Dialect = TWILIO) -> str:
    return _outbound("mark", stream_sid, dialect, mark={"name": name})


def clear_message(stream_sid: str, dialect: Dialect = TWILIO) -> str:
    return _outbound("clear", stream_sid, dialect)


class CallEnded(Exception):
    """The far end said `stop`: the call is over."""


class MediaStreamCall:
    """One media stream's state, with no I/O: messages in, transport events and messages out."""

    def __init__(self, dialect: Dialect = TWILIO) -> None:
        self.dialect = dialect
        self.start: Start | None = None
        self._pending: OrderedDict[str, tuple[int, str]] = OrderedDict()  # mark name -> (chunk id, event)
        self.dropped_audio = 0  # pieces sent before `start` named the stream (nowhere to send them)

    @property
    def stream_sid(self) -> str | None:
        return self.start.stream_sid if self.start else None

    @property
    def _codec(self) -> Codec:
        """The codec of the encoding `start` named; only used once it has come."""
        return self.dialect.encodings[self.start.encoding]

    def receive(self, message: str | bytes, now: float | None = None) -> InputEvent | None:
        """One message from the far end -> an input event, or None when it carries none. Raises
        ProtocolError for a bad message and CallEnded on `stop`."""
        ev = parse_message(message, self.dialect)
        if isinstance(ev, Start):
            self.start = ev
            return ClientEvent("call_start", {"stream_sid": ev.stream_sid, "call_sid": ev.call_sid,
                                              **{f"param_{k}": v for k, v in ev.custom_parameters.items()}})
        if isinstance(ev, Media):
            if self.start is None:
                raise ProtocolError("no_start", "media before the 'start' message")
            if ev.track not in ("inbound", "inbound_track"):
                return None  # our own audio echoed back (tracks="both_tracks"): not the caller
            return AudioIn(int16_to_float(self._codec.decode(ev.payload)), RATE)
        if isinstance(ev, Mark):
            hit = self._pending.pop(ev.name, None)
            if hit is None:
                return None  # cleared before it played, or not ours
            return Played(hit[0], hit[1], now)
        if isinstance(ev, Dtmf):
            return ClientEvent("dtmf", {"digit": ev.digit})
        if isinstance(ev, Stop):
            raise CallEnded(ev.call_sid)
        return None  # connected

    def audio(self, chunk_id: int, pcm16: np.ndarray) -> list[str]:
        """Messages that queue one piece of 8 kHz int16 audio for playback, between two marks."""
        sid = self.stream_sid
        if sid is None:
            self.dropped_audio += 1
            return []
        start, end = f"s{chunk_id}", f"e{chunk_id}"
        for name, event in ((start, "start"), (end, "end")):
            self._pending[name] = (chunk_id, event)
        while len(self._pending) > MAX_PENDING_MARKS:
            self._pending.popitem(last=False)
        d = self.dialect
        return [mark_message(sid, start, d), media_message(sid, self._codec.encode(pcm16), d), mark_message(sid, end, d)]

    def clear(self) -> list[str]:
        """Messages that drop everything queued at the far end; its marks never count as played."""
        self._pending.clear()
        return [clear_message(self.stream_sid, self.dialect)] if self.stream_sid else []
