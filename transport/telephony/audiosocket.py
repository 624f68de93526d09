"""Asterisk AudioSocket (SIP through a PBX: `AudioSocket(uuid,host:port)` in the dialplan), Sans-I/O.

Wire format (TCP, both directions): frames of a 1-byte kind, a 2-byte big-endian payload length
and the payload (docs.asterisk.org, Channel Drivers / AudioSocket):

  0x00  hangup (no payload)             0x01  call UUID (16 bytes), Asterisk's first frame
  0x03  DTMF digit (1 ASCII byte)       0xff  error (optional 1-byte code; 0x01: the caller hung up)
  0x10  audio: signed 16-bit little-endian mono PCM at 8 kHz (320 bytes = 20 ms);
        newer Asterisk also sends 0x11-0x18 for 12, 16, 24, 32, 44.1, 48, 96 and 192 kHz

Asterisk plays audio as it arrives and buffers almost none, so the server must send it at real
time, 20 ms at a time. `transport.playback.Playback` is that pacing without a clock: the shell
calls `tick` every 20 ms; it knows which piece of audio starts and ends in each frame (`Played` events) and a
barge-in (`clear`) drops what has not been sent.
"""
from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

import numpy as np

from transport.audio import int16_to_float
from transport.base import AudioIn, ClientEvent, InputEvent, ProtocolError

HANGUP, UUID, DTMF, ERROR = 0x00, 0x01, 0x03, 0xFF
AUDIO_KINDS = {0x10: 8000, 0x11: 12000, 0x12: 16000, 0x13: 24000, 0x14: 32000, 0x15: 44100,
               0x16: 48000, 0x17: 96000, 0x18: 192000}
ERROR_CALLER_HUNG_UP = 0x01
HEADER = struct.Struct(">BH")
FRAME_S = 0.02
DTMF_DIGITS = set(b"0123456789*#ABCDabcd")


@dataclass(frozen=True)
class Frame:
    kind: int
    payload: bytes = b""


def encode_frame(kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > 0xFFFF:
        raise ValueError(f"AudioSocket payloads are at most 65535 bytes, got {len(payload)}")
    return HEADER.pack(kind, len(payload)) + payload


def encode_audio(pcm16: np.ndarray, rate: int = 8000) -> bytes:
    kind = next(k for k, r in AUDIO_KINDS.items() if r == rate)
    return encode_frame(kind, np.asarray(pcm16, dtype="<i2").tobytes())


class FrameParser:
    """Bytes in (any split), whole frames out. Holds at most one unfinished frame (< 64 KiB)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames, at = [], 0
        while len(self._buf) - at >= HEADER.size:
            kind, n = HEADER.unpack_from(self._buf, at)
            if len(self._buf) - at - HEADER.size < n:
                break
            start = at + HEADER.size
            frames.append(Frame(kind, bytes(self._buf[start:start + n])))
            at = start + n
        del self._buf[:at]
        return frames


class CallEnded(Exception):
    """Asterisk hung up."""


class AudioSocketCall:
    """One call's state, no I/O: frames in -> input events."""

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.rate = 8000  # of the caller's audio; the bot answers at the same rate

    def receive(self, frame: Frame) -> InputEvent | None:
        """An input event, or None. Raises ProtocolError for a bad frame, CallEnded on hangup."""
        kind, payload = frame.kind, frame.payload
        if kind in AUDIO_KINDS:
            if len(payload) % 2:
                raise ProtocolError("bad_audio", f"16-bit audio frame with an odd byte count ({len(payload)})")
            self.rate = AUDIO_KINDS[kind]
            return AudioIn(int16_to_float(np.frombuffer(payload, dtype="<i2")), self.rate)
        if kind == UUID:
            if len(payload) != 16:
                raise ProtocolError("bad_message", f"a UUID frame carries 16 bytes, not {len(payload)}")
            self.call_id = str(uuid.UUID(bytes=payload))
            return ClientEvent("call_start", {"call_id": self.call_id})
        if kind == DTMF:
            if len(payload) != 1 or payload[0] not in DTMF_DIGITS:
                raise ProtocolError("bad_message", f"a DTMF frame carries one digit, got {payload[:8]!r}")
            return ClientEvent("dtmf", {"digit": payload.decode("ascii")})
        if kind == HANGUP:
            raise CallEnded(self.call_id or "")
        if kind == ERROR:
            code = payload[0] if payload else 0
            if code == ERROR_CALLER_HUNG_UP:
                raise CallEnded(self.call_id or "")
            return ClientEvent("far_end_error", {"code": code})
        raise ProtocolError("unknown_kind", f"unknown AudioSocket frame kind 0x{kind:02x}")
