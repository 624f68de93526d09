"""A bounded ring of the most recent audio, preallocated."""
from __future__ import annotations

import numpy as np


class AudioRing:
    """The last `capacity` samples of the input, preallocated (bounded)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._buf = np.zeros(capacity, dtype=np.float32)
        self._n = 0  # total samples ever pushed

    def push(self, x: np.ndarray) -> None:
        total = x.size
        x = x[-self.capacity:]  # older samples of a chunk longer than the ring are gone anyway
        i = (self._n + total - x.size) % self.capacity
        k = min(x.size, self.capacity - i)
        self._buf[i:i + k] = x[:k]
        self._buf[:x.size - k] = x[k:]
        self._n += total

    def window_levels(self, count: int, window: int, align: int | None = None) -> list[float]:
        """RMS of the last `count` complete `window`-sample windows of the stream, ending where
        the last complete `align`-sample window ends (both aligned with its first sample, as the
        VAD's frames are; `align` defaults to `window`); fewer if the ring no longer holds them.
        Finer windows read with the VAD's frame as `align` end where its last scored frame does."""
        x = self.last_whole(count * window, align or window)
        whole = x.size - x.size % window
        if whole == 0:
            return []
        x = x[x.size - whole:].reshape(-1, window)
        return np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=1)).tolist()

    def last_whole(self, n: int, window: int) -> np.ndarray:
        """At most `n` samples, ending where the last complete `window` ends (windows aligned
        with the stream's first sample): the audio the VAD has scored."""
        pending = self._n % window
        x = self.last(n + pending)
        return x[:x.size - pending][-n:]

    def last(self, n: int) -> np.ndarray:
        n = min(n, self._n, self.capacity)
        end = self._n % self.capacity
        if n <= end:
            return self._buf[end - n:end].copy()
        return np.concatenate([self._buf[self.capacity - (n - end):], self._buf[:end]])

    @property
    def total(self) -> int:
        """Samples ever pushed: the stream position of the next one."""
        return self._n

    def since(self, start: int) -> np.ndarray:
        """The samples from stream position `start` on (as many of them as the ring still holds)."""
        return self.last(max(0, self._n - start))


def merged_levels(levels: list[float], per: int) -> list[float]:
    """RMS levels of equal windows, `per` at a time, as the levels of windows `per` times as
    long (the last ones; a leading remainder is dropped)."""
    x = np.asarray(levels[len(levels) % per:], np.float64).reshape(-1, per)
    return np.sqrt(np.mean(np.square(x), axis=1)).tolist()
