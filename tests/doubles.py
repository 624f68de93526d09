"""Test doubles for orchestration, behind the real interfaces: a scripted recognizer, a scripted
LLM, a tone voice and an energy VAD. With them the real Session runs without models,
deterministically, in real time or on the virtual clock (tests/virtual_time.py). (The real
components are proven by the `models` tests.)

Input "speech" is noise bursts (`burst`); the recognizer hands the k-th burst the k-th text of
its script, word by word, at times inside the burst, and holds each word back `delay_s` as a
causal model does.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable

import numpy as np

from asr.base import (
    Flushed, Gap, Partial, RecognizerEvent, RecognizerFailed, RecognizerUnavailable, Word, WordEvent)
from tts.base import AudioChunk

RATE = 16000
_CLOSED = object()


def burst(seconds: float, seed: int = 0, level: float = 0.2) -> np.ndarray:
    """Speech stand-in: white noise the energy VAD hears as speech."""
    return (np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * level).astype(np.float32)


class EnergyVAD:
    """Speech probability per 512-sample window from its RMS (the VAD interface Silero has)."""

    def __init__(self, threshold: float = 0.02):
        self.threshold = threshold
        self._pending = np.zeros(0, np.float32)

    def __call__(self, pcm: np.ndarray) -> list[float]:
        buf = np.concatenate([self._pending, np.asarray(pcm, np.float32)])
        n = buf.size // 512
        frames = buf[:n * 512].reshape(n, 512)
        self._pending = buf[n * 512:].copy()
        return [1.0 if float(np.sqrt(np.mean(f * f))) > self.threshold else 0.0 for f in frames]


# ---- recognizer --------------------------------------------------------------------------------
class ScriptedRecognizer:
    """Opens `ScriptedStream`s; `slots` of them at most (None: any number)."""

    name = "scripted"
    sample_rate = RATE

    def __init__(self, script: list[str], delay_s: float = 0.2, word_s: float = 0.15, slots: int | None = None,
                 gap_at_s: float | None = None, fail_at_s: float | None = None,
                 guesses: dict[int, tuple[str, str]] | None = None, flush_s: float = 0.0):
        self.script, self.delay_s, self.word_s, self.slots = script, delay_s, word_s, slots
        self.flush_s = flush_s  # a flush's own time: a decode on a busy CPU
        # burst k -> a partial (text, stable text) given 0.3 s into it, before any of its words:
        # a guess the recognizer may take back (Whisper's unstable tail)
        self.guesses = guesses or {}
        self.gap_at_s, self.fail_at_s = gap_at_s, fail_at_s
        self.open_streams: list[ScriptedStream] = []
        self.opened = 0

    async def open_stream(self) -> "ScriptedStream":
        if self.slots is not None and len(self.open_streams) >= self.slots:
            raise RecognizerUnavailable(f"no free slot: all {self.slots} recognizer slots are busy")
        stream = ScriptedStream(self)
        self.open_streams.append(stream)
        self.opened += 1
        return stream


class ScriptedStream:
    """A causal recognizer: words of burst k come from script[k], `delay_s` after they end."""

    def __init__(self, rec: ScriptedRecognizer):
        self.rec = rec
        self.sample_rate = RATE
        self.delay_s = rec.delay_s
        self._events: asyncio.Queue = asyncio.Queue(maxsize=256)
        self._t = 0.0  # stream time fed
        self._segment: tuple[float, float] | None = None  # (start, last loud time) of the burst going on
        self._quiet = 0.0
        self._index = 0  # bursts seen
        self._pending: list[Word] = []  # words of the current burst, not yet emitted
        self._since_flush: list[str] = []
        self._guess: tuple[str, str] | None = None  # the current burst's guess, until given
        self._gap_sent = self._failed = False
        self.fed_s = 0.0
        self.closed = False

    async def feed(self, pcm: np.ndarray) -> None:
        for k in range(0, pcm.size, 320):
            frame = pcm[k:k + 320]
            loud = float(np.sqrt(np.mean(frame * frame))) > 0.02 if frame.size else False
            self._t += frame.size / RATE
            if loud:
                if self._segment is None:
                    self._start_segment(self._t - frame.size / RATE)
                self._segment = (self._segment[0], self._t)
                if self._guess is not None and self._t - self._segment[0] >= 0.3:
                    await self._events.put(Partial(*self._guess))
                    self._guess = None
                self._quiet = 0.0
            elif self._segment is not None:
                self._quiet += frame.size / RATE
                if self._quiet >= 0.15:
                    self._end_segment()
        self.fed_s = self._t
        await self._emit_due(self._t - self.delay_s)
        if self.rec.gap_at_s is not None and not self._gap_sent and self._t >= self.rec.gap_at_s:
            self._gap_sent = True
            await self._events.put(Gap(self._t - 0.2, self._t, "reconnected to the recognizer"))
        if self.rec.fail_at_s is not None and not self._failed and self._t >= self.rec.fail_at_s:
            self._failed = True
            await self._events.put(RecognizerFailed("recognizer connection lost"))

    def _start_segment(self, t: float) -> None:
        text = self.rec.script[self._index] if self._index < len(self.rec.script) else ""
        self._guess = self.rec.guesses.get(self._index)
        self._index += 1
        words = text.split()
        self._segment = (t, t)
        self._pending = [Word(w, t + i * self.rec.word_s, t + (i + 1) * self.rec.word_s) for i, w in enumerate(words)]

    def _end_segment(self) -> None:
        """The burst is over: its words that did not fit are squeezed in before its end."""
        start, end = self._segment
        self._segment = None
        late = [w for w in self._pending if w.end > end]
        if late:
            step = (end - min(late[0].start, end)) / len(late)
            t0 = end - step * len(late)
            keep = [w for w in self._pending if w.end <= end]
            self._pending = keep + [Word(w.text, t0 + i * step, t0 + (i + 1) * step) for i, w in enumerate(late)]

    async def _emit_due(self, t: float) -> None:
        due = [w for w in self._pending if w.end <= t and (self._segment is None or w.end <= self._segment[1])]
        if not due:
            return
        self._pending = self._pending[len(due):]
        for w in due:
            await self._events.put(WordEvent(w))
            self._since_flush.append(w.text)
        await self._events.put(Partial(" ".join(self._since_flush), " ".join(self._since_flush)))

    async def events(self) -> AsyncIterator[RecognizerEvent]:
        while (ev := await self._events.get()) is not _CLOSED:
            if isinstance(ev, RecognizerFailed):
                raise ev
            yield ev

    async def flush(self, until_s: float) -> None:
        """As a causal model does: silence pushed through the delay ends the burst going on."""
        if self.rec.flush_s:
            await asyncio.sleep(self.rec.flush_s)
        if self._segment is not None and self._segment[1] <= until_s:
            self._end_segment()
        await self._emit_due(until_s)
        self._since_flush = []
        await self._events.put(Flushed(until_s))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.rec.open_streams.remove(self)
            self._events.put_nowait(_CLOSED)


# ---- LLM and voice -------------------------------------------------------------------------------
class ScriptedLLM:
    """Answers from `replies` (a function of the last user message, or a fixed text), one word
    every `token_s`, cancellable at every token. Records the prompts it was given."""

    name = "scripted-llm"

    def __init__(self, replies: str | Callable[[str], str] = "OK.", token_s: float = 0.01, warm_s: float = 0.0):
        self.replies, self.token_s, self.warm_s = replies, token_s, warm_s
        self.requests: list[list[dict]] = []
        self.cancelled = 0
        self.warmed: list[list[dict]] = []
        self.warms_stopped: list[str] = []

    def answer(self, user: str) -> str:
        return self.replies(user) if callable(self.replies) else self.replies

    async def stream(self, messages, max_tokens=None) -> AsyncIterator[str]:
        self.requests.append([dict(m) for m in messages])
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        words = self.answer(user).split(" ")
        try:
            for i, w in enumerate(words[:max_tokens] if max_tokens else words):
                await asyncio.sleep(self.token_s)
                yield w if i == 0 else " " + w
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    def warm(self, messages, stop=None) -> None:
        """Records the prompt; with `warm_s`, a read-ahead of the user's words so far (a prompt
        that ends with theirs) takes that long (blocking, as a model's would) or until `stop` is
        set, and records the user's words of each read-ahead stopped."""
        self.warmed.append([dict(m) for m in messages])
        deadline = time.monotonic() + (self.warm_s if messages and messages[-1]["role"] == "user" else 0.0)
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                self.warms_stopped.append(messages[-1]["content"])
                return
            time.sleep(0.005)


class ToneVoice:
    """A tone of `word_s` per word of each text chunk (int16 at `sample_rate`)."""

    name = "tone"

    def __init__(self, sample_rate: int = 16000, word_s: float = 0.12):
        self.sample_rate, self.word_s = sample_rate, word_s

    async def stream(self, text_chunks: AsyncIterator[str]) -> AsyncIterator[AudioChunk]:
        async for text in text_chunks:
            text = text.strip()
            n_words = len(re.findall(r"\w+", text))
            if not n_words:
                continue
            await asyncio.sleep(0.005)  # synthesis takes a little time
            t = np.arange(int(n_words * self.word_s * self.sample_rate)) / self.sample_rate
            pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
            yield AudioChunk(pcm, self.sample_rate, text)


class ToolScriptLLM:
    """An LLM that calls tools: `script(messages, tools)` returns the items of one answer, text
    words (str) and `llm.base.ToolCall`s, yielded one every `token_s`. Records each request
    with the tools it was offered."""

    name = "tool-script-llm"

    def __init__(self, script: Callable[[list[dict], list[dict] | None], list], token_s: float = 0.01):
        self.script, self.token_s = script, token_s
        self.requests: list[list[dict]] = []
        self.offered: list[list[dict] | None] = []

    async def stream(self, messages, max_tokens=None, tools=None) -> AsyncIterator:
        self.requests.append([dict(m) for m in messages])
        self.offered.append(tools)
        for item in self.script(messages, tools):
            await asyncio.sleep(self.token_s)
            yield item


def said(text: str) -> list[str]:
    """`text` as a model streams it: its first word, then each next one with its space."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class OneContextLLM(ScriptedLLM):
    """An embedded model's shape: one context, so a stream holds the model's lock from its first
    token until it is closed (a reader that stops reading keeps it). `continues_text`: it can go
    on from an answer's first words (`prefix=`), as llm/llamacpp.py does."""

    continues_text = True

    def __init__(self, replies, token_s: float = 0.01):
        super().__init__(replies, token_s)
        self.lock = asyncio.Lock()
        self.prefixes: list[str] = []

    async def stream(self, messages, max_tokens=None, tools=None, prefix: str = "") -> AsyncIterator[str]:
        self.prefixes.append(prefix)
        async with self.lock:
            user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            answer = self.answer(user)
            assert answer.startswith(prefix), "a continuation starts from what was said"
            pieces = re.findall(r"\s*\S+", answer[len(prefix):])
            for piece in pieces[:max_tokens] if max_tokens else pieces:
                await asyncio.sleep(self.token_s)
                yield piece
