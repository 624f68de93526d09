"""The recognizer vocabulary: words with times, hypotheses, and the streaming protocol."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the stream
    end: float


@dataclass(frozen=True)
class Hypothesis:
    """A partial (final=False) or final transcript of the current utterance."""

    text: str
    words: tuple[Word, ...] = ()
    final: bool = False
    stable_text: str = ""  # prefix that later partials will not change (committed words)


class RecognizerStream(Protocol):
    """One connection's recognition state. Blocking methods: call them from a worker thread."""

    sample_rate: int

    def push(self, pcm: np.ndarray) -> None:
        """Append float32 mono samples at `sample_rate`."""

    def partial(self, keep_going: Callable[[], bool] | None = None) -> Hypothesis | None:
        """Re-evaluate the utterance so far; None when nothing new is worth decoding. A
        recognizer may ask `keep_going()` between its stages and abandon the partial (None)
        when it says no."""

    def decode(self, n_samples: int | None = None) -> Hypothesis:
        """Final-quality hypothesis of the first `n_samples` (default: all) without ending the
        utterance (speculation). Implementations may cache it for `finalize`."""

    def finalize(self, n_samples: int | None = None) -> Hypothesis:
        """Decode the utterance (its first `n_samples`), return the final hypothesis, start anew."""

    def reset(self, start_s: float | None = None) -> None:
        """Drop the current utterance without decoding it; the next one starts at stream time
        `start_s` seconds (word times are reported on that clock)."""


class StreamingRecognizer(Protocol):
    """A loaded model that opens independent streams."""

    sample_rate: int

    def open_stream(self) -> RecognizerStream: ...
