"""duplex browser protocol, Sans-I/O: pure encode/decode functions, fuzzable without sockets.

Client -> server
  binary   PCM16 little-endian mono audio at the declared rate (the page sends 20 ms frames)
  text     JSON objects:
           {"type": "hello", "sample_rate": 16000}          declare the mic rate (default 16000)
           {"type": "played", "id": N, "event": "start"|"end", "t": page_ms, "server_ms": est}
                     est: the page's estimate of the server clock (ping/pong offset), optional
           {"type": "ping", "t": page_ms}                    clock-offset probe
           {"type": "metrics", "turn": N, "mouth_to_ear_ms": x}
                     measured in the page: capture of the user's last speech sample -> first
                     reply sample played
Server -> client
  binary   4-byte big-endian chunk id, then PCM16 little-endian mono at `ready.sample_rate`
  text     JSON: ready, state, partial, final, bot_text, bot_done, latency, interrupted, clear,
           pong, error {"type": "error", "code": ..., "message": ...}
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import numpy as np

from transport.audio import INPUT_RATE, int16_to_float
from transport.base import ProtocolError
from transport.wire import json_object

MIN_RATE, MAX_RATE = 8000, 48000
MAX_AUDIO_BYTES = 48000  # 0.5 s at 48 kHz; the page sends 640 bytes per 20 ms at 16 kHz
MAX_TEXT_BYTES = 4096
CLIENT_TYPES = {"hello", "played", "ping", "metrics"}


@dataclass(frozen=True)
class ClientAudio:
    pcm: np.ndarray  # float32


@dataclass(frozen=True)
class ClientControl:
    type: str
    data: dict


def decode_client(message: str | bytes) -> ClientAudio | ClientControl:
    """Decode one client WebSocket message, or raise ProtocolError with a clear reason."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        data = bytes(message)
        if len(data) > MAX_AUDIO_BYTES:
            raise ProtocolError("frame_too_large",
                                f"audio frame of {len(data)} bytes exceeds {MAX_AUDIO_BYTES}; send 20 ms frames")
        if len(data) % 2:
            raise ProtocolError("bad_audio", f"PCM16 frame has an odd byte count ({len(data)})")
        pcm = int16_to_float(np.frombuffer(data, dtype="<i2"))
        return ClientAudio(pcm)
    if not isinstance(message, str):
        raise ProtocolError("bad_message", f"unsupported message type {type(message).__name__}")
    obj = json_object(message, MAX_TEXT_BYTES, "type")
    kind = obj["type"]
    if kind not in CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {kind[:40]!r}")
    if kind == "hello":
        rate = obj.get("sample_rate", INPUT_RATE)
        if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
            raise ProtocolError("bad_sample_rate",
                                f"sample_rate must be an integer between {MIN_RATE} and {MAX_RATE} Hz, got {rate!r}")
        return ClientControl("hello", {"sample_rate": rate})
    if kind == "played":
        cid, event = obj.get("id"), obj.get("event")
        if isinstance(cid, bool) or not isinstance(cid, int) or cid < 0 or event not in ("start", "end"):
            raise ProtocolError("bad_message", "played needs an integer 'id' >= 0 and 'event' start|end")
        return ClientControl("played", {"id": cid, "event": event, "t": _number(obj, "t"),
                                        "server_ms": _number(obj, "server_ms")})
    if kind == "metrics":
        turn = obj.get("turn")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ProtocolError("bad_message", "metrics needs an integer 'turn' >= 0")
        m2e = _number(obj, "mouth_to_ear_ms")
        if m2e is None:
            raise ProtocolError("bad_message", "metrics needs 'mouth_to_ear_ms'")
        return ClientControl("metrics", {"turn": turn, "mouth_to_ear_ms": m2e})
    return ClientControl(kind, {"t": _number(obj, "t")})


MAX_MS = 1e15  # ~31,700 years: any clock reading, and its nanoseconds still fit a float and an int


def _number(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > MAX_MS or not math.isfinite(v):
        raise ProtocolError("bad_message", f"{key!r} must be a finite number of milliseconds "
                                           f"(at most {MAX_MS:.0e} in size)")
    return float(v)


def encode_event(event: dict) -> str:
    return json.dumps(event, separators=(",", ":"))


def error_event(code: str, message: str) -> str:
    return encode_event({"type": "error", "code": code, "message": message})


def encode_audio(chunk_id: int, pcm16: np.ndarray) -> bytes:
    return struct.pack(">I", chunk_id & 0xFFFFFFFF) + np.asarray(pcm16, dtype="<i2").tobytes()


def decode_audio(data: bytes) -> tuple[int, np.ndarray]:
    if len(data) < 4 or (len(data) - 4) % 2:
        raise ProtocolError("bad_audio", "server audio frame must be a 4-byte id plus PCM16")
    (cid,) = struct.unpack(">I", data[:4])
    return cid, np.frombuffer(data[4:], dtype="<i2")
