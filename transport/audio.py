"""PCM helpers shared by every transport: sample formats and a streaming low-lag resampler."""
from __future__ import annotations

import numpy as np
import soxr

# The rate a caller's audio is taken at where its wire does not say: what the browser page and the
# microphone send, and what WebRTC's Opus is resampled to. It is the rate the speech models hear
# (asr.base.SPEECH_RATE, which transports may not import; tests/test_constants.py holds them equal),
# so audio at it reaches them unresampled.
INPUT_RATE = 16000


def int16_to_float(pcm: np.ndarray) -> np.ndarray:
    return (np.asarray(pcm, dtype=np.int16).astype(np.float32)) / 32768.0


def float_to_int16(x: np.ndarray) -> np.ndarray:
    x = np.nan_to_num(np.asarray(x, dtype=np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(x, -1.0, 32767 / 32768) * 32768.0).astype(np.int16)


class StreamResampler:
    """Chunk-by-chunk resampling with soxr at a low-latency quality.

    soxr's VHQ adds 60-85 ms of delay on 20 ms chunks; 'LQ' keeps the lag to a few ms, which is
    what a live call needs. Identity rates pass through untouched.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "LQ"):
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"invalid sample rates {in_rate} -> {out_rate}")
        self.in_rate, self.out_rate = in_rate, out_rate
        self._rs = None if in_rate == out_rate else soxr.ResampleStream(
            in_rate, out_rate, 1, dtype="float32", quality=quality)

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if self._rs is None:
            return x
        return self._rs.resample_chunk(x, last=last)


def resample(x: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Whole-buffer resampling (offline use: files, tests)."""
    if in_rate == out_rate:
        return np.asarray(x, dtype=np.float32)
    return soxr.resample(np.asarray(x, dtype=np.float32), in_rate, out_rate, quality="HQ")


def read_mono(path, rate: int) -> np.ndarray:
    """A sound file as mono float32 at `rate` (offline use: benches, tools)."""
    import soundfile as sf

    x, r = sf.read(path, dtype="float32")
    return resample(x.mean(axis=1) if x.ndim > 1 else x, r, rate)


class Int16RateAdapter:
    """Brings int16 chunks from any source rate to one output rate, streaming, with one resampler
    per source rate (a voice change mid-call keeps working)."""

    def __init__(self, out_rate: int):
        self.out_rate = out_rate
        self._resamplers: dict[int, StreamResampler] = {}

    def __call__(self, pcm: np.ndarray, rate: int) -> np.ndarray:
        if rate == self.out_rate:
            return pcm
        rs = self._resamplers.get(rate)
        if rs is None:
            rs = self._resamplers[rate] = StreamResampler(rate, self.out_rate)
        return float_to_int16(rs(int16_to_float(pcm)))
