"""Kyutai moshi-server ASR wire format (`/api/asr-streaming`), Sans-I/O: pure encode/decode.

Every WebSocket message is one binary frame holding a msgpack map with a "type" key. See
asr/PROTOCOL.md for the full description. Decoding never raises anything but `BadMessage`,
whose text is meant to be sent back to the client in an `Error` message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import numpy as np

SAMPLE_RATE = 24000
FRAME_SIZE = 1920  # 80 ms: one model step, answered by one Step
MAX_PCM_SAMPLES = 10 * SAMPLE_RATE  # one message may carry at most the whole input buffer
MAX_MARKER_ID = 2**63 - 1


class BadMessage(ValueError):
    """A message that does not follow the protocol: a client's the server refuses (str(error) is
    the text of its Error reply), or a server's the client cannot read."""


# ---- client -> server ----------------------------------------------------------------------
@dataclass(frozen=True)
class Audio:
    pcm: np.ndarray = field(repr=False)  # float32 mono at 24 kHz, finite, 1..MAX_PCM_SAMPLES samples


@dataclass(frozen=True)
class Marker:
    id: int


@dataclass(frozen=True)
class Init:
    """Sent by some moshi clients; accepted and ignored."""


@dataclass(frozen=True)
class Flush:
    """duplex extension: end of stream, push the model's delay worth of silence through."""


ClientMessage = Audio | Marker | Init | Flush


# ---- server -> client ----------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Word:
    text: str
    start_time: float


@dataclass(frozen=True)
class EndWord:
    stop_time: float


@dataclass(frozen=True)
class Step:
    step_idx: int
    prs: tuple[float, ...] = ()  # moshi's VAD head probabilities; empty: these models have none


@dataclass(frozen=True)
class MarkerReply:
    id: int


@dataclass(frozen=True)
class Error:
    message: str


ServerMessage = Ready | Word | EndWord | Step | MarkerReply | Error


def encode_server(msg: ServerMessage, buffered_pcm: int) -> bytes:
    """msgpack bytes for one server message; every message reports the buffered input samples."""
    if isinstance(msg, Ready):
        d: dict = {"type": "Ready"}
    elif isinstance(msg, Word):
        d = {"type": "Word", "text": msg.text, "start_time": float(msg.start_time)}
    elif isinstance(msg, EndWord):
        d = {"type": "EndWord", "stop_time": float(msg.stop_time)}
    elif isinstance(msg, Step):
        d = {"type": "Step", "step_idx": int(msg.step_idx), "prs": [float(p) for p in msg.prs]}
    elif isinstance(msg, MarkerReply):
        d = {"type": "Marker", "id": int(msg.id)}
    elif isinstance(msg, Error):
        d = {"type": "Error", "message": msg.message}
    else:
        raise TypeError(f"not a server message: {msg!r}")
    d["buffered_pcm"] = int(buffered_pcm)
    return msgpack.packb(d)


def encode_client(msg: ClientMessage) -> bytes:
    """msgpack bytes for one client message (what Kyutai's clients send)."""
    if isinstance(msg, Audio):
        return msgpack.packb({"type": "Audio", "pcm": np.asarray(msg.pcm, np.float32).tolist()},
                             use_single_float=True)
    if isinstance(msg, Marker):
        return msgpack.packb({"type": "Marker", "id": int(msg.id)})
    if isinstance(msg, Init):
        return msgpack.packb({"type": "Init"})
    if isinstance(msg, Flush):
        return msgpack.packb({"type": "Flush"})
    raise TypeError(f"not a client message: {msg!r}")


def decode_server(data: bytes) -> dict:
    """Decode a server message to a plain dict (for clients and tests)."""
    d = msgpack.unpackb(data, raw=False)
    if not isinstance(d, dict) or not isinstance(d.get("type"), str):
        raise BadMessage("server message is not a map with a string 'type'")
    return d


def decode_client(data: bytes | bytearray | memoryview | str, max_samples: int = MAX_PCM_SAMPLES) -> ClientMessage:
    """Validate and decode one client frame. Raises BadMessage with a client-facing reason."""
    if isinstance(data, str):
        raise BadMessage("text frames are not accepted: send msgpack in binary frames")
    try:
        d = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, max_array_len=max_samples + 1,
                            max_map_len=64, max_str_len=1 << 16, max_bin_len=1 << 16, max_ext_len=0)
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, ValueError, ...)
        raise BadMessage(f"malformed msgpack: {type(e).__name__}") from None
    if not isinstance(d, dict):
        raise BadMessage("message must be a msgpack map")
    kind = d.get("type")
    if not isinstance(kind, str):
        raise BadMessage("message needs a string 'type'")
    if kind == "Audio":
        return Audio(_pcm(d.get("pcm"), max_samples))
    if kind == "Marker":
        mid = d.get("id")
        if isinstance(mid, bool) or not isinstance(mid, int) or not -MAX_MARKER_ID - 1 <= mid <= MAX_MARKER_ID:
            raise BadMessage("Marker 'id' must be a 64-bit integer")
        return Marker(mid)
    if kind == "Init":
        return Init()
    if kind == "Flush":
        return Flush()
    if kind == "OggOpus":
        raise BadMessage("OggOpus input is not supported by this server: send Audio (float32 pcm)")
    raise BadMessage(f"unknown message type {kind[:40]!r}")


def _pcm(value, max_samples: int) -> np.ndarray:
    if not isinstance(value, (list, tuple)):
        raise BadMessage("Audio 'pcm' must be an array of numbers")
    if not value:
        raise BadMessage("Audio 'pcm' is empty")
    if len(value) > max_samples:
        raise BadMessage(f"Audio 'pcm' has {len(value)} samples; at most {max_samples} per message")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise BadMessage("Audio 'pcm' must be a flat array of numbers") from None
    if arr.ndim != 1 or arr.dtype.kind not in "fiu":
        raise BadMessage("Audio 'pcm' must be a flat array of numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        pcm = arr.astype(np.float32)
    if not np.isfinite(pcm).all():
        raise BadMessage("Audio 'pcm' holds NaN or infinite (or float32-overflowing) samples")
    return pcm


def parse_server(d: dict) -> ServerMessage | None:
    """A decoded server map (`decode_server`) as a typed message; None for a type this client does
    not know (newer servers may add some). Raises BadMessage on a known type with bad fields."""
    kind = d.get("type")
    try:
        if kind == "Ready":
            return Ready()
        if kind == "Word":
            return Word(str(d["text"]), float(d["start_time"]))
        if kind == "EndWord":
            return EndWord(float(d["stop_time"]))
        if kind == "Step":
            return Step(int(d.get("step_idx", 0)), tuple(float(p) for p in d.get("prs") or ()))
        if kind == "Marker":
            return MarkerReply(int(d["id"]))
        if kind == "Error":
            return Error(str(d.get("message", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise BadMessage(f"bad {kind} message from the server: {type(e).__name__} {e}") from None
    return None
