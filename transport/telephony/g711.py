"""G.711 companding (μ-law and A-law), the phone network's 8-bit sample formats, as table lookups.

Bit-exact with the ITU-T G.711 reference (Sun's g711.c), which is what CPython's `audioop` and
therefore pipecat's serializers use: μ-law encodes the top 14 bits of a 16-bit sample, A-law the
top 13. `audioop` is deprecated and gone in Python 3.13; these tables need only numpy.
"""
from __future__ import annotations

import numpy as np

_SEG_END_ULAW = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SEG_END_ALAW = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + 33  # clip, then the bias (0x84 >> 2)
    seg = np.searchsorted(_SEG_END_ULAW, mag)  # first segment whose end >= mag
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0xF))
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13-bit
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_SEG_END_ALAW, mag)
    shifted = np.where(seg < 2, mag >> 1, mag >> np.maximum(seg, 1))
    code = np.where(seg >= 8, 0x7F, (seg << 4) | (shifted & 0xF))
    return (code ^ mask).astype(np.uint8)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, np.where(seg == 1, t + 0x108, (t + 0x108) << np.maximum(seg - 1, 0)))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENC, _ULAW_DEC = _ulaw_encode_table(), _ulaw_decode_table()
_ALAW_ENC, _ALAW_DEC = _alaw_encode_table(), _alaw_decode_table()


def _index(pcm16: np.ndarray) -> np.ndarray:
    return np.asarray(pcm16, dtype=np.int16).astype(np.int32) + 32768


def ulaw_encode(pcm16: np.ndarray) -> bytes:
    """int16 samples -> μ-law bytes (one per sample)."""
    return _ULAW_ENC[_index(pcm16)].tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes -> int16 samples."""
    return _ULAW_DEC[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(pcm16: np.ndarray) -> bytes:
    """int16 samples -> A-law bytes (one per sample)."""
    return _ALAW_ENC[_index(pcm16)].tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)]
