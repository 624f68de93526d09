"""The recognizer vocabulary: words with times, recognizer events, and the streaming interface.

One push-based interface for every recognizer, shaped for causal streaming models (Kyutai's
protocol is the model of it). A conversation opens one stream, feeds it audio continuously
(silence included: a streaming model keeps its context) and reads typed events. Stream time is
the seconds of audio the caller has fed, from 0 at open; every time in an event is on that
clock, whatever a recognizer does inside (a causal model flushes with silence of its own and
maps its clock back).

- `feed(pcm)` waits while the stream's bounded input buffer is full (backpressure).
- `events()` yields `WordEvent` (a word with start/end), `Partial` (text since the last flush,
  with its stable prefix), `PauseProbability` (where the model has an end-of-turn head),
  `Flushed` (after the words a `flush` asked for) and `Gap` (audio lost: a remote recognizer
  reconnected).
- `flush(until_s)` returns once every word that ends before `until_s` has been emitted; the
  `Flushed(until_s)` event follows those words in `events()`.

A recognizer that re-decodes (Whisper) may also implement `Utterances`: hints of where speech
starts, and an early decode at a pause that the next `flush` reuses (speculation).
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# The rate the speech models here hear: Silero VAD, Whisper, and the end-of-turn model (Whisper's
# features); Kyutai's hear 24 kHz (asr.moshi_protocol.SAMPLE_RATE). transport.audio.INPUT_RATE is
# the same number for the transports, which may not import asr (tests/test_constants.py holds
# them equal).
SPEECH_RATE = 16000


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds of stream time
    end: float


@dataclass(frozen=True)
class Hypothesis:
    """A partial (final=False) or final transcript of an utterance."""

    text: str
    words: tuple[Word, ...] = ()
    final: bool = False
    stable_text: str = ""  # prefix that later partials will not change (committed words)


# ---- events -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordEvent:
    word: Word


@dataclass(frozen=True)
class Partial:
    """The text recognized since the last flush; `stable_text` is the prefix that will not change."""

    text: str
    stable_text: str = ""


@dataclass(frozen=True)
class PauseProbability:
    """The model's probability, at stream time `t`, that the speaker has finished their turn."""

    t: float
    probability: float


@dataclass(frozen=True)
class Flushed:
    """Every word ending before `until_s` has been emitted (the answer to `flush(until_s)`)."""

    until_s: float


@dataclass(frozen=True)
class Gap:
    """Stream time [start_s, end_s) reached no recognizer (a remote one was lost and replaced)."""

    start_s: float
    end_s: float
    reason: str


RecognizerEvent = WordEvent | Partial | PauseProbability | Flushed | Gap


class RecognizerUnavailable(RuntimeError):
    """No capacity to open a stream: every slot is taken, every server full or unreachable.
    The message says which, for the user."""


class RecognizerFailed(RuntimeError):
    """A stream broke and could not be recovered; the message says why."""


# ---- the interface ----------------------------------------------------------------------------
class RecognizerStream(Protocol):
    """One conversation's stream. All methods run on the event loop."""

    sample_rate: int  # of the audio `feed` takes
    delay_s: float  # how long after a word ends it is emitted, at most (causal models)

    async def feed(self, pcm: np.ndarray) -> None:
        """Append float32 mono samples at `sample_rate`; waits while the buffer is full."""

    def events(self) -> AsyncIterator[RecognizerEvent]:
        """The stream's events, in order; ends after `close()` (or raises RecognizerFailed)."""

    async def flush(self, until_s: float) -> None:
        """Return once every word that ends before stream time `until_s` has been emitted."""

    async def close(self) -> None:
        """Release the stream's resources (its slot, its connection). Idempotent."""


class StreamingRecognizer(Protocol):
    """A loaded recognizer (or a client of one) that opens independent streams."""

    name: str
    sample_rate: int

    async def open_stream(self) -> RecognizerStream:
        """A new stream; raises RecognizerUnavailable when there is no capacity."""


@runtime_checkable
class Utterances(Protocol):
    """Optional capability of a recognizer that decodes utterances rather than a stream."""

    def begin_utterance(self, start_s: float) -> None:
        """Speech starts at stream time `start_s` (preroll included): decode from here on."""

    def speaking(self, active: bool) -> None:
        """Whether the user is speaking (the caller's VAD): partials are decoded only then."""

    async def decode_early(self, until_s: float, quick: bool = False) -> Hypothesis:
        """Final-quality text of the utterance up to `until_s`, without emitting it (a pause:
        speculation). A later `flush(until_s)` over the same audio reuses the result. `quick`:
        the caller waits on these words (speech over the bot), so no slower second look at an
        unsure decode, and a recognizer may search less for a brief one."""

    async def words_so_far(self, until_s: float) -> str:
        """A quick look at the text of the utterance up to `until_s` while it is still said
        (greedy, no word times, nothing kept): for a decision that cannot wait for its end."""
