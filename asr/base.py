"""The recognizer vocabulary: words with times, hypotheses, and the streaming protocol."""
from __future__ import annotations

from dataclasses import dataclass, field
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

    def partial(self) -> Hypothesis | None:
        """Re-evaluate the utterance so far; None when nothing new is worth decoding."""

    def finalize(self) -> Hypothesis:
        """Decode the whole utterance, return the final hypothesis and start a new utterance."""

    def reset(self) -> None:
        """Drop the current utterance without decoding it."""


class StreamingRecognizer(Protocol):
    """A loaded model that opens independent streams."""

    sample_rate: int

    def open_stream(self) -> RecognizerStream: ...


@dataclass
class RecognizerInfo:
    name: str
    sample_rate: int
    extra: dict = field(default_factory=dict)
