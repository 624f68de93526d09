"""Twilio-style bidirectional media streams over a WebSocket, Sans-I/O, in four dialects:

- Twilio Media Streams (`<Connect><Stream url="wss://host/twilio"/>`);
- Telnyx Media Streaming (`stream_url=wss://host/telnyx`, `stream_bidirectional_mode=rtp`);
- Plivo Audio Streams (`<Stream bidirectional="true" contentType="audio/x-l16;rate=16000">
  wss://host/plivo</Stream>`);
- Exotel's Voicebot applet (`wss://host/exotel`, optionally `?sample-rate=16000`).

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

The others differ only in names and formats (`Dialect`):
- Telnyx: "stream_id", "call_control_id", "custom_parameters", "media_format" {"encoding": "PCMU" |
  "PCMA", "sample_rate": 8000}; our messages carry no stream id. Marks and `clear` as Twilio's.
- Plivo: "streamId", "callId", "mediaFormat" {"encoding": "audio/x-mulaw" (8 kHz) | "audio/x-l16"
  (8 or 16 kHz, little-endian int16), "sampleRate"}; custom values come as a top-level
  "extra_headers" string ("k1=v1;k2=v2"). No `connected` and no `stop` (the socket closes). We
  send {"event": "playAudio", "streamId": S, "media": {"contentType": the stream's encoding,
  "sampleRate": its rate, "payload": ...}}, {"event": "checkpoint", "streamId": S, "name": N}
  (echoed as {"event": "playedStream", "name": N} once the audio before it has played) and
  {"event": "clearAudio", "streamId": S} (answered by "clearedAudio").
- Exotel: snake_case as Telnyx ("stream_sid", "call_sid"), audio as raw 16-bit little-endian PCM
  at 8, 16 or 24 kHz ("media_format" {"encoding": "audio/x-raw", "sample_rate": "8000"}: numbers
  may come as strings, and the encoding's name varies between Exotel's own documents). Exotel
  wants every payload we send to be a multiple of 320 bytes (else its player leaves a gap), so
  ours are padded with silence to the next multiple.

The far end buffers everything sent to it and plays it in order, so what the caller heard is
known only from marks (`transport.telephony.marks`): one before and one after each audio piece.
After a `clear`, echoes of the marks that were queued are ignored: that audio was never played
(Twilio and Telnyx hand them back; Plivo is said not to). The echoes do not say which marks were
reached and which were cleared, so an echo still on the wire when we send `clear` is dropped
with them (the caller heard at most one network round trip more than we count).
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from transport.audio import int16_to_float
from transport.base import AudioIn, ClientEvent, InputEvent, ProtocolError
from transport.telephony.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from transport.telephony.marks import PlayoutMarks
from transport.wire import json_object

MAX_PAYLOAD_BYTES = 48000  # 1 s of 24 kHz 16-bit audio in one message; Twilio sends 20 ms (160 bytes)
MAX_MESSAGE_CHARS = 80 * 1024  # the largest payload, base64, and the message around it
DTMF_DIGITS = set("0123456789*#ABCDabcd")


class Codec(NamedTuple):
    decode: Callable[[bytes], np.ndarray]  # wire bytes -> int16 samples
    encode: Callable[[np.ndarray], bytes]


def _l16_decode(data: bytes) -> np.ndarray:
    if len(data) % 2:
        raise ProtocolError("bad_audio", f"16-bit PCM payload of {len(data)} bytes (an odd number)")
    return np.frombuffer(data, "<i2").astype(np.int16)


def _l16_encode(pcm: np.ndarray) -> bytes:
    return np.asarray(pcm, dtype="<i2").tobytes()


ULAW, ALAW, L16 = Codec(ulaw_decode, ulaw_encode), Codec(alaw_decode, alaw_encode), Codec(_l16_decode, _l16_encode)


@dataclass(frozen=True)
class Dialect:
    """The names and formats one provider gives the same protocol."""

    name: str
    stream_id: str  # key of the stream's id, in `start` and in every message we send
    call_id: str
    format: str  # key of the media format object in `start`
    rate: str
    params: str  # key of the custom parameters: an object in `start`, or a "k=v;k=v" string
    encodings: dict[str, Codec]  # by wire name (compared in lower case)
    default_encoding: str
    rates: tuple[int, ...] = (8000,)
    addressed: bool = True  # our messages carry the stream's id (Twilio needs it, Telnyx's omit it)
    media_event: str = "media"  # what we send audio as
    mark_event: str = "mark"  # what we send a mark as
    mark_echoes: tuple[str, ...] = ("mark",)  # what a reached mark comes back as
    flat_marks: bool = False  # a mark's name sits in the message ({"name": N}), not in {"mark": {...}}
    clear_event: str = "clear"
    format_in_media: bool = False  # our audio messages say their encoding and rate (Plivo)
    payload_multiple: int = 1  # our payloads are padded with silence to a multiple of this many bytes
    ignored: frozenset[str] = frozenset()  # events that carry nothing for us


TWILIO = Dialect("twilio", "streamSid", "callSid", "mediaFormat", "sampleRate", "customParameters",
                 {"audio/x-mulaw": ULAW, "audio/x-alaw": ALAW}, "audio/x-mulaw")
TELNYX = Dialect("telnyx", "stream_id", "call_control_id", "media_format", "sample_rate", "custom_parameters",
                 {"pcmu": ULAW, "pcma": ALAW}, "PCMU", addressed=False)
PLIVO = Dialect("plivo", "streamId", "callId", "mediaFormat", "sampleRate", "extra_headers",
                {"audio/x-mulaw": ULAW, "audio/x-l16": L16}, "audio/x-mulaw", rates=(8000, 16000),
                media_event="playAudio", mark_event="checkpoint", mark_echoes=("playedStream", "played"),
                flat_marks=True, clear_event="clearAudio", format_in_media=True,
                ignored=frozenset({"clearedAudio"}))
EXOTEL = Dialect("exotel", "stream_sid", "call_sid", "media_format", "sample_rate", "custom_parameters",
                 {name: L16 for name in ("audio/x-raw", "raw", "slin", "linear16", "pcm", "audio/l16",
                                         "audio/x-l16", "base64")} | {"audio/x-mulaw": ULAW},
                 "audio/x-raw", rates=(8000, 16000, 24000), payload_multiple=320)
DIALECTS = {d.name: d for d in (TWILIO, TELNYX, PLIVO, EXOTEL)}


@dataclass(frozen=True)
class Connected:
    protocol: str


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str = ""
    tracks: tuple[str, ...] = ("inbound",)
    custom_parameters: dict = field(default_factory=dict)
    encoding: str = "audio/x-mulaw"  # a key of the dialect's `encodings`; mono
    rate: int = 8000


@dataclass(frozen=True)
class Media:
    payload: bytes  # the audio bytes as sent
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


def _number(value) -> int | None:
    """8000, or "8000" (Exotel sends numbers as strings), or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*\d{1,6}\s*(hz)?\s*", value, re.IGNORECASE):
        return int(re.sub(r"\D", "", value))
    return None


def _custom_parameters(value, key: str) -> dict[str, str]:
    """An object of strings, or Plivo's "k1=v1;k2=v2" header string; at most 32, names cut to 64."""
    if isinstance(value, str):
        value = dict(part.split("=", 1) for part in value[:4096].split(";") if "=" in part)
    if not isinstance(value, dict):
        raise ProtocolError("bad_message", f"'{key}' must be an object")
    return {str(k).strip()[:64]: v for k, v in list(value.items())[:32] if isinstance(v, str)}


def _start(msg: dict, d: Dialect) -> Start:
    start = _obj(msg, "start")
    sid = _str(start, d.stream_id, msg.get(d.stream_id))
    fmt = start.get(d.format, {})
    if not isinstance(fmt, dict):
        raise ProtocolError("bad_message", f"'{d.format}' must be an object")
    rate, channels = _number(fmt.get(d.rate, d.rates[0])), _number(fmt.get("channels", 1))
    encoding = _str(fmt, "encoding", d.default_encoding).lower()
    if encoding not in d.encodings or rate not in d.rates or channels != 1:
        raise ProtocolError("unsupported_format",
                            f"media format {encoding[:40]} {fmt.get(d.rate)!r} Hz x{fmt.get('channels', 1)!r}: "
                            f"{d.name} streams are spoken in {' or '.join(sorted(set(d.encodings)))}, mono, "
                            f"at {' or '.join(map(str, d.rates))} Hz")
    tracks = start.get("tracks", ["inbound"])
    if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
        raise ProtocolError("bad_message", "'tracks' must be a list of strings")
    params = _custom_parameters(start.get(d.params, msg.get(d.params, {})), d.params)
    return Start(sid, _str(start, d.call_id, ""), tuple(tracks[:4]), params, encoding, rate)


def parse_message(message: str | bytes, dialect: Dialect = TWILIO) -> StreamEvent | None:
    """Decode one message from the far end (None: an event that carries nothing for us), or raise
    ProtocolError saying what is wrong with it."""
    d = dialect
    if not isinstance(message, str):
        raise ProtocolError("bad_message", f"{d.name} sends JSON text frames, not binary ones")
    msg = json_object(message, MAX_MESSAGE_CHARS, "event")
    event = msg["event"]
    if event == "connected":
        return Connected(_str(msg, "protocol", ""))
    if event == "start":
        return _start(msg, d)
    if event == "media":
        media = _obj(msg, "media")
        payload = _str(media, "payload", limit=MAX_PAYLOAD_BYTES * 4 // 3 + 4)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("bad_audio", "media payload is not valid base64") from None
        return Media(data, _str(media, "track", "inbound"))
    if event in d.mark_echoes:
        return Mark(_str(msg if d.flat_marks else _obj(msg, "mark"), "name"))
    if event == "dtmf":
        digit = _str(_obj(msg, "dtmf"), "digit")
        if digit not in DTMF_DIGITS:
            raise ProtocolError("bad_message", f"unknown DTMF digit {digit[:8]!r}")
        return Dtmf(digit)
    if event == "stop":
        stop = msg.get("stop", {})
        return Stop(_str(stop, d.call_id, "") if isinstance(stop, dict) else "")
    if event in d.ignored:
        return None
    raise ProtocolError("unknown_event", f"unknown event {event[:40]!r}")


def _outbound(event: str, stream_sid: str, dialect: Dialect, **body) -> str:
    return json.dumps({"event": event, **({dialect.stream_id: stream_sid} if dialect.addressed else {}), **body})


def media_message(stream_sid: str, payload: bytes, dialect: Dialect = TWILIO, encoding: str = "",
                  rate: int = 8000) -> str:
    """Audio to queue for playback; `encoding` and `rate` are said only where the dialect wants it."""
    media = {"payload": base64.b64encode(payload).decode("ascii")}
    if dialect.format_in_media:
        media = {"contentType": encoding, "sampleRate": rate, **media}
    return _outbound(dialect.media_event, stream_sid, dialect, media=media)


def mark_message(stream_sid: str, name: str, dialect: Dialect = TWILIO) -> str:
    body = {"name": name} if dialect.flat_marks else {"mark": {"name": name}}
    return _outbound(dialect.mark_event, stream_sid, dialect, **body)


def clear_message(stream_sid: str, dialect: Dialect = TWILIO) -> str:
    return _outbound(dialect.clear_event, stream_sid, dialect)


class CallEnded(Exception):
    """The far end said `stop`: the call is over."""


class MediaStreamCall:
    """One media stream's state, with no I/O: messages in, transport events and messages out."""

    def __init__(self, dialect: Dialect = TWILIO) -> None:
        self.dialect = dialect
        self.start: Start | None = None
        self.marks = PlayoutMarks()
        self.dropped_audio = 0  # pieces sent before `start` named the stream (nowhere to send them)

    @property
    def name(self) -> str:
        return self.dialect.name

    @property
    def stream_sid(self) -> str | None:
        return self.start.stream_sid if self.start else None

    @property
    def rate(self) -> int | None:
        """The stream's sample rate, both ways, once `start` has said it."""
        return self.start.rate if self.start else None

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
            return AudioIn(int16_to_float(self._codec.decode(ev.payload)), self.start.rate)
        if isinstance(ev, Mark):
            return self.marks.reached(ev.name, now)
        if isinstance(ev, Dtmf):
            return ClientEvent("dtmf", {"digit": ev.digit})
        if isinstance(ev, Stop):
            raise CallEnded(ev.call_sid)
        return None  # connected, or an event that carries nothing for us

    def audio(self, chunk_id: int, pcm16: np.ndarray) -> list[str]:
        """Messages that queue one piece of int16 audio at the stream's rate for playback,
        between two marks."""
        sid = self.stream_sid
        if sid is None:
            self.dropped_audio += 1
            return []
        start, end = self.marks.around(chunk_id)
        d = self.dialect
        payload = self._codec.encode(pcm16)
        if short := -len(payload) % d.payload_multiple:
            silence = self._codec.encode(np.zeros(1, np.int16))
            payload += silence * (short // len(silence))
        return [mark_message(sid, start, d),
                media_message(sid, payload, d, self.start.encoding, self.start.rate),
                mark_message(sid, end, d)]

    def clear(self) -> list[str]:
        """Messages that drop everything queued at the far end; its marks never count as played."""
        self.marks.clear()
        return [clear_message(self.stream_sid, self.dialect)] if self.stream_sid else []
