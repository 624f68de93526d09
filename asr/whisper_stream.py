"""The embedded Whisper behind the streaming interface (`asr.base.RecognizerStream`).

Whisper is not causal: it re-decodes an utterance. The adapter keeps the last seconds of the
stream in a ring and decodes from the start of the current utterance: partials (LocalAgreement,
see `asr.whisper.UtteranceDecoder`) every `hop_s` of new audio while the user speaks, and the
words at `flush(until_s)`. With the `Utterances` hints the listener says where speech starts and
whether the user is speaking, and asks for an early decode at a pause (speculation) that the
flush reuses. Without hints the utterance runs from the previous flush.

Decodes run on the recognizer's own one-thread executor (CTranslate2 decodes are serialised
by the recognizer anyway), never on asyncio's default one.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from asr.base import SPEECH_RATE, Flushed, Hypothesis, Partial, RecognizerEvent, WordEvent
from asr.ring import AudioRing
from asr.whisper import WhisperOptions, WhisperRecognizer

_CLOSED = object()


class StreamingWhisper:
    """A loaded Whisper model that opens `WhisperAdapterStream`s (all share its executor)."""

    sample_rate = SPEECH_RATE

    def __init__(self, whisper: WhisperRecognizer):
        self.whisper = whisper
        self.name = whisper.name
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asr-whisper")

    @classmethod
    def load(cls, name: str = "whisper-tiny.en", options: WhisperOptions | None = None, **kwargs) -> "StreamingWhisper":
        return cls(WhisperRecognizer.load(name, options=options, **kwargs))

    async def open_stream(self) -> "WhisperAdapterStream":
        return WhisperAdapterStream(self.whisper, self._executor)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class WhisperAdapterStream:
    """One conversation's stream; implements `RecognizerStream` and `Utterances`."""

    sample_rate = SPEECH_RATE
    delay_s = 0.0  # words come at the flush; nothing is held back by a model delay

    def __init__(self, whisper: WhisperRecognizer, executor: ThreadPoolExecutor, event_queue: int = 64):
        self._whisper, self._executor = whisper, executor
        self._decoder = whisper.open_decoder()
        self._ring = AudioRing(int((whisper.options.max_utterance_s + 2) * SPEECH_RATE))
        self._events: asyncio.Queue = asyncio.Queue(maxsize=event_queue)
        self._lock = asyncio.Lock()  # one decoder operation at a time
        self._utt_start: int | None = 0  # stream sample where the utterance starts; None: no utterance
        self._synced = 0  # stream sample up to which the decoder holds the utterance
        self._speaking = True  # without hints, partials run whenever audio comes
        self._hinted = False  # begin_utterance was called: the listener says where speech is
        self._urgent = 0  # early decodes or flushes waiting: a running partial gives way
        self._finals = 0  # flushes waiting or decoding: the decoder holds their utterance until they are done
        self._next_start: int | None = None  # an utterance begun meanwhile: the decoder moves to it after them
        self._partial_task: asyncio.Task | None = None
        self._last_partial = ""
        self._closed = False

    # ---- RecognizerStream ---------------------------------------------------------------------
    async def feed(self, pcm: np.ndarray) -> None:
        if self._closed:
            raise RuntimeError("stream closed")
        self._ring.push(np.asarray(pcm, np.float32).reshape(-1))
        if self._speaking and self._utt_start is not None and (self._partial_task is None or self._partial_task.done()):
            hop = int(self._whisper.options.hop_s * SPEECH_RATE)
            if self._ring.total - self._decoder_decoded_at() >= hop:
                self._partial_task = asyncio.create_task(self._partial(), name="asr-partial")

    async def events(self) -> AsyncIterator[RecognizerEvent]:
        while (ev := await self._events.get()) is not _CLOSED:
            yield ev

    async def flush(self, until_s: float) -> None:
        hyp = await self._decode(until_s, final=True) if self._utt_start is not None else None
        for w in hyp.words if hyp is not None else ():
            await self._events.put(WordEvent(w))
        await self._events.put(Flushed(until_s))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._partial_task is not None:
            self._partial_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._partial_task
        with contextlib.suppress(asyncio.QueueFull):
            self._events.put_nowait(_CLOSED)

    # ---- Utterances -------------------------------------------------------------------------
    def begin_utterance(self, start_s: float) -> None:
        start = max(int(round(start_s * SPEECH_RATE)), self._ring.total - self._ring.capacity, 0)
        self._hinted = True
        self._last_partial = ""
        self._speaking = True
        if self._finals:
            # the last utterance's final decode has not run (or runs in its thread): resetting
            # the decoder now would take its audio from under it, and its end would then drop this one
            self._next_start = start
        else:
            self._restart(start)

    def speaking(self, active: bool) -> None:
        """The listener's VAD: partials are decoded only while the user speaks."""
        self._speaking = active

    async def decode_early(self, until_s: float, quick: bool = False) -> Hypothesis:
        if self._utt_start is None:
            return Hypothesis("", final=True)
        return await self._decode(until_s, final=False, quick=quick)

    async def words_so_far(self, until_s: float) -> str:
        if self._utt_start is None:
            return ""
        self._urgent += 1  # a running partial gives way
        try:
            async with self._lock:
                self._sync()
                return await self._run(self._decoder.glance, int(round(until_s * SPEECH_RATE)) - self._utt_start)
        finally:
            self._urgent -= 1

    # ---- decoding -----------------------------------------------------------------------------
    def _decoder_decoded_at(self) -> int:
        return (self._utt_start or 0) + self._decoder.decoded_samples

    def _restart(self, start: int) -> None:
        self._utt_start = self._synced = start
        self._decoder.reset(start / SPEECH_RATE)

    def _sync(self) -> None:
        """Hand the decoder the audio that came since it was last synced (loop thread, locked)."""
        pcm = self._ring.since(self._synced)
        room = self._decoder.room_samples
        if pcm.size > room:
            pcm = pcm[:room]  # the turn machine ends utterances before this; never grow
        if pcm.size:
            self._decoder.push(pcm)
        self._synced += pcm.size

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _partial(self) -> None:
        async with self._lock:
            if self._utt_start is None or not self._speaking or self._next_start is not None:
                return
            self._sync()
            hyp = await self._run(lambda: self._decoder.partial(
                keep_going=lambda: self._speaking and not self._urgent and not self._closed))
        if hyp is not None and hyp.text and hyp.text != self._last_partial:
            self._last_partial = hyp.text
            await self._events.put(Partial(hyp.text, hyp.stable_text))

    async def _decode(self, until_s: float, final: bool, quick: bool = False) -> Hypothesis:
        self._urgent += 1
        self._finals += final
        try:
            async with self._lock:
                self._sync()
                n = int(round(until_s * SPEECH_RATE)) - (self._utt_start or 0)
                hyp = await self._run(self._decoder.decode, n, quick)
                if final:
                    self._last_partial = ""
                    if self._next_start is not None:  # the next utterance began while this one ended
                        self._restart(self._next_start)
                        self._next_start = None
                    elif self._hinted:
                        self._utt_start = None  # until the next begin_utterance
                        self._speaking = False
                    else:
                        self._restart(self._utt_start + max(0, n))
            return hyp
        finally:
            self._urgent -= 1
            self._finals -= final
