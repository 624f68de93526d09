"""One `asr.base.RecognizerStream` for every recognizer that speaks Kyutai's ASR messages: an
in-process engine slot (asr.engine.recognizer) or a remote moshi-server / `duplex asr-serve`
(asr.remote). Both hand this module a `MoshiLink`; everything else is shared.

Two layers:
- Sans-I/O: `StreamClock` maps the model's clock to the caller's, `MoshiEventCore` turns server
  messages (asr.moshi_protocol) into base events and plans flushes. Pure bookkeeping, no awaits.
- `MoshiStream`: the asyncio shell. One reader task feeds the core from the link and puts its
  events on a bounded queue; `feed` and `flush` send under one lock, so the clock always knows
  the order of what the model received.

Words: a `Word` message opens a word; it becomes a `WordEvent` when its end is known (`EndWord`,
or the next `Word`'s start). Kyutai's `EndWord` comes with the *next* word's first token, so the
last word before a pause stays open until a flush closes it.

Flush: the model emits text `delay_s` after the audio it describes, so `flush(until_s)` makes
sure the model has audio up to `until_s` plus a small margin (inserting silence of its own if the
caller has not fed that far), sends a `Marker`, then `delay_s` of silence so the marker comes
back without waiting for more caller audio. Once it is back, every word that ended before
`until_s` has been emitted; a word still open that started before `until_s` is closed at
`until_s` (or where the caller's audio stopped, if earlier): the inserted silence ends it, and
its later `EndWord` would fall on the far side of that silence.

Clock: silence the stream inserts shifts the model's clock against the caller's. `StreamClock`
keeps the inserted stretches and maps every time back; a time inside inserted silence maps to
the caller instant where the silence was inserted. After a reconnect, the new link's clock starts
at the caller's current time and a `Gap` covers what no recognizer transcribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from asr.base import (
    Flushed,
    Gap,
    Partial,
    PauseProbability,
    RecognizerEvent,
    RecognizerFailed,
    Word,
    WordEvent,
)
from asr.moshi_protocol import FRAME_SIZE, SAMPLE_RATE, EndWord, Error, MarkerReply, ServerMessage, Step
from asr.moshi_protocol import Word as WordMessage

MAX_CHUNK = 12 * FRAME_SIZE  # samples per message/feed call (about 1 s)
DEFAULT_FLUSH_MARGIN_FRAMES = 2  # audio past `until_s` before the marker: trailing text tokens close
PRUNE_SLACK_S = 10  # inserted stretches this far behind the latest word time are forgotten
MOSHI_PAUSE_HEAD = 2  # moshi-server's Step.prs[2]: end-of-turn probability (as Kyutai's unmute reads it)

log = logging.getLogger("duplex.asr.stream")


# ---- Sans-I/O ---------------------------------------------------------------------------------
class StreamClock:
    """Samples the caller fed (the stream clock) against samples the current link received.

    The two differ by silence the stream inserted itself and by where the current link started
    (after a reconnect). Inserted stretches are pruned once no later time can fall before them,
    and capped, so memory is bounded."""

    def __init__(self, max_segments: int = 256):
        self.caller_samples = 0  # fed by the caller since open
        self.model_samples = 0  # received by the current link
        self._base = 0  # caller sample at the current link's model sample 0
        self._shift = 0  # inserted samples of the segments already pruned
        self._segments: deque[tuple[int, int]] = deque()  # (model start, length) of inserted silence
        self._max_segments = max_segments

    def fed(self, n: int, sent: bool = True) -> None:
        """The caller fed `n` samples; `sent`: the current link received them."""
        self.caller_samples += n
        if sent:
            self.model_samples += n

    def inserted(self, n: int) -> None:
        """The stream sent `n` samples of its own silence to the current link."""
        if n <= 0:
            return
        if self._segments and sum(self._segments[-1]) == self.model_samples:
            start, length = self._segments.pop()  # contiguous with the last stretch: one segment
            self._segments.append((start, length + n))
        else:
            self._segments.append((self.model_samples, n))
        while len(self._segments) > self._max_segments:  # only far-past times lose precision
            self._shift += self._segments.popleft()[1]
        self.model_samples += n

    def restart(self) -> None:
        """A new link: its model sample 0 is the caller's current sample."""
        self._base = self.caller_samples
        self.model_samples = 0
        self._shift = 0
        self._segments.clear()

    @property
    def link_start(self) -> int:
        """The caller sample where the current link began."""
        return self._base

    def is_inserted(self, m: int) -> bool:
        return any(start <= m < start + length for start, length in self._segments)

    def to_caller(self, m: int) -> int:
        """Caller sample of model sample `m`."""
        shift = self._shift
        for start, length in self._segments:
            if m < start:
                break
            if m < start + length:  # inside inserted silence: the caller instant it was inserted at
                return self._base + start - shift
            shift += length
        return self._base + m - shift

    def to_model(self, c: int) -> int:
        """Model sample of caller sample `c`: the later one where silence was inserted at `c`,
        0 before the current link began, extrapolated past the end of what was fed."""
        if c >= self.caller_samples:
            return self.model_samples + (c - self.caller_samples)
        if c <= self._base:
            return 0
        shift = self._shift
        for start, length in self._segments:
            if self._base + start - shift > c:
                break
            shift += length
        return c - self._base + shift

    def prune(self, m_min: int) -> None:
        """No model time before `m_min` will be asked for again."""
        while self._segments and sum(self._segments[0]) <= m_min:
            self._shift += self._segments.popleft()[1]


@dataclass(frozen=True)
class FlushPlan:
    """What the shell sends for one flush, in order: silence, the marker, silence."""

    marker_id: int
    silence_before: int  # samples
    silence_after: int


@dataclass(frozen=True)
class FlushDone:
    """Core-internal event: the flush with this marker is complete (its `Flushed` came before)."""

    marker_id: int


@dataclass
class _PendingFlush:
    until_s: float
    until: int  # caller sample
    fed: int  # caller samples fed when the flush was asked for


class MoshiEventCore:
    """Server messages in, base events out; plans flushes and keeps the clock (Sans-I/O)."""

    def __init__(self, delay_s: float, sample_rate: int = SAMPLE_RATE, frame_size: int = FRAME_SIZE,
                 flush_margin_frames: int = DEFAULT_FLUSH_MARGIN_FRAMES, pause_head: int | None = MOSHI_PAUSE_HEAD,
                 max_partial_words: int = 256):
        self.sr, self.frame = sample_rate, frame_size
        self.delay_frames = max(0, math.ceil(delay_s * sample_rate / frame_size - 1e-9))
        self.margin_frames = flush_margin_frames
        self.pause_head = pause_head
        self.clock = StreamClock()
        self._open: tuple[str, int] | None = None  # (text, caller start) of the word awaiting its end
        self._since_flush: deque[str] = deque(maxlen=max_partial_words)  # emitted words, for Partial
        self._last_partial = Partial("", "")
        self._last_end = 0  # caller sample: end of the last emitted word
        self._confirmed = 0  # model sample up to which every word is out (Step, word times)
        self._latest = 0  # model sample of the latest word time received: later ones are not earlier
        self._pending: dict[int, _PendingFlush] = {}
        self._next_marker = 1
        self._gap_start: int | None = None

    # ---- flushes ---------------------------------------------------------------------------
    def plan_flush(self, until_s: float) -> FlushPlan:
        """Register a flush and say what to send. The shell must send exactly that next, telling
        the clock (`clock.inserted`) about the silence as it goes."""
        marker_id = self._next_marker
        self._next_marker += 1
        clock, frame = self.clock, self.frame
        until = max(0, round(until_s * self.sr))
        self._pending[marker_id] = _PendingFlush(until_s, until, clock.caller_samples)
        # The model must hold audio up to `until` plus a margin before the marker...
        target = math.ceil(clock.to_model(until) / frame) * frame + self.margin_frames * frame
        before = max(0, target - clock.model_samples)
        # ... and the marker comes back once `delay` frames after it are processed (moshi's rule).
        at_marker = clock.model_samples + before
        after = (math.ceil(at_marker / frame) + self.delay_frames) * frame - at_marker
        return FlushPlan(marker_id, before, after)

    @property
    def pending_flushes(self) -> int:
        return len(self._pending)

    # ---- messages --------------------------------------------------------------------------
    def on_message(self, msg: ServerMessage) -> list[RecognizerEvent | FlushDone]:
        out: list[RecognizerEvent | FlushDone] = []
        clock = self.clock
        if isinstance(msg, WordMessage):
            m = self._samples(msg.start_time)
            start = clock.to_caller(m)
            if self._open is not None:
                self._close_open(start, out)
            self._open = (msg.text, max(start, self._last_end))
            self._confirm(m)
            self._latest = max(self._latest, m)
        elif isinstance(msg, EndWord):
            m = self._samples(msg.stop_time)
            if self._open is not None:  # none: the word was closed by a flush or a lost link
                self._close_open(clock.to_caller(m), out)
            self._confirm(m)
            self._latest = max(self._latest, m)
        elif isinstance(msg, Step):
            m = msg.step_idx * self.frame
            self._confirm(m - self.delay_frames * self.frame)
            if self.pause_head is not None and len(msg.prs) > self.pause_head and not clock.is_inserted(m):
                out.append(PauseProbability(clock.to_caller(m) / self.sr, float(msg.prs[self.pause_head])))
        elif isinstance(msg, MarkerReply):
            flush = self._pending.pop(msg.id, None)
            if flush is not None:
                if self._open is not None and self._open[1] < flush.until:
                    self._close_open(min(flush.until, flush.fed), out)
                self._confirm(clock.to_model(min(flush.until, clock.caller_samples)))
                self._partial(out)  # the text up to here, all of it stable, before the Flushed
                out.append(Flushed(flush.until_s))
                self._since_flush.clear()
                self._last_partial = Partial("", "")
                self._partial(out)
                out.append(FlushDone(msg.id))
                return out
        self._partial(out)
        # Word times never go back (a Word starts where the last ended); the slack covers a
        # server whose words overlap a little (Whisper's).
        clock.prune(self._latest - PRUNE_SLACK_S * self.sr)
        return out

    # ---- lost links ------------------------------------------------------------------------
    def link_lost(self) -> list[RecognizerEvent]:
        """The link is gone: close the open word where transcription stopped."""
        out: list[RecognizerEvent] = []
        start = max(self._last_end, min(self.clock.to_caller(self._confirmed), self.clock.caller_samples))
        self._gap_start = max(start, self.clock.link_start)
        if self._open is not None:
            self._close_open(self._gap_start, out)
        self._partial(out)
        return out

    def link_restored(self, reason: str) -> tuple[list[RecognizerEvent], list[tuple[int, float]]]:
        """A new link starts at the caller's current time. Returns the `Gap` and the flushes
        (old marker id, until_s) to plan again on it."""
        start = self._gap_start if self._gap_start is not None else self.clock.caller_samples
        gap = Gap(start / self.sr, self.clock.caller_samples / self.sr, reason)
        self._gap_start = None
        self.clock.restart()
        self._confirmed = self._latest = 0
        self._last_end = max(self._last_end, self.clock.caller_samples)
        pending = [(mid, f.until_s) for mid, f in self._pending.items()]
        self._pending.clear()
        return [gap], pending

    # ---- internals -------------------------------------------------------------------------
    def _samples(self, t: float) -> int:
        return max(0, round(float(t) * self.sr))

    def _confirm(self, m: int) -> None:
        self._confirmed = max(self._confirmed, min(m, self.clock.model_samples))

    def _close_open(self, end: int, out: list) -> None:
        text, start = self._open
        self._open = None
        end = max(start, end)
        self._last_end = max(self._last_end, end)
        if text.strip():  # a real tokenizer can decode a run of special tokens to nothing
            out.append(WordEvent(Word(text, start / self.sr, end / self.sr)))
            self._since_flush.append(text)

    def _partial(self, out: list) -> None:
        stable = " ".join(self._since_flush)
        text = stable
        if self._open is not None and self._open[0].strip():
            text = f"{stable} {self._open[0]}" if stable else self._open[0]
        p = Partial(text, stable)
        if p != self._last_partial:
            self._last_partial = p
            out.append(p)


# ---- the asyncio shell ------------------------------------------------------------------------
class LinkLost(Exception):
    """The link to the recognizer ended; `final`: reconnecting would not help (an eviction)."""

    def __init__(self, reason: str, final: bool = False):
        super().__init__(reason)
        self.reason, self.final = reason, final


class MoshiLink(Protocol):
    """One connection to a Kyutai-protocol recognizer: an engine slot or a WebSocket."""

    async def send_audio(self, pcm: np.ndarray) -> None:
        """Send float32 samples; waits while the recognizer's buffer is full. Raises LinkLost."""

    async def send_marker(self, marker_id: int) -> None:
        """Raises LinkLost."""

    async def receive(self) -> list[ServerMessage]:
        """The next server messages (possibly none); raises LinkLost when the link has ended."""

    async def close(self) -> None: ...


Reopen = Callable[[MoshiLink], Awaitable[MoshiLink]]  # a new link after this one was lost
_END = object()


class MoshiStream:
    """`asr.base.RecognizerStream` over a `MoshiLink`. Construct it on the running loop.

    `reopen`: how to get a new link when the current one is lost (None: the stream fails with
    RecognizerFailed instead). Read `events()` while calling `flush`: the event queue is bounded
    and a full one holds the reader (and so the recognizer) back."""

    def __init__(self, link: MoshiLink, *, delay_s: float, name: str = "recognizer",
                 sample_rate: int = SAMPLE_RATE, frame_size: int = FRAME_SIZE, reopen: Reopen | None = None,
                 flush_margin_frames: int = DEFAULT_FLUSH_MARGIN_FRAMES,
                 pause_head: int | None = MOSHI_PAUSE_HEAD, events_max: int = 512, max_pending_flushes: int = 16,
                 on_gap: Callable[[Gap], None] | None = None):
        self.sample_rate, self.delay_s, self.name = sample_rate, delay_s, name
        self._core = MoshiEventCore(delay_s, sample_rate, frame_size, flush_margin_frames, pause_head)
        self._link = link
        self._link_ok = True
        self._reopen = reopen
        self._events: asyncio.Queue = asyncio.Queue(events_max)
        self._send_lock = asyncio.Lock()  # feed and flush: the clock must match what was sent
        self._connected = asyncio.Event()
        self._connected.set()
        self._flush_slots = asyncio.Semaphore(max_pending_flushes)  # below the server's marker cap
        self._waiters: dict[int, asyncio.Future] = {}
        self._last_error: str | None = None
        self._failure: RecognizerFailed | None = None
        self._closed = self._ended = False
        self.gaps = 0
        self.gap_seconds = 0.0  # caller audio that reached no recognizer
        self._on_gap = on_gap  # the recognizer's count over all its streams
        self._reader = asyncio.create_task(self._run(), name=f"asr-stream-reader {name}")

    # ---- RecognizerStream ------------------------------------------------------------------
    @property
    def link(self) -> MoshiLink:
        return self._link

    @property
    def fed_samples(self) -> int:
        """Samples the caller fed so far (stream time x sample_rate)."""
        return self._core.clock.caller_samples

    @property
    def model_samples(self) -> int:
        """Samples the current link received: the caller's plus the stream's own silence."""
        return self._core.clock.model_samples

    async def feed(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        for i in range(0, pcm.size, MAX_CHUNK):
            chunk = pcm[i:i + MAX_CHUNK]
            async with self._send_lock:
                self._check_open()
                sent = await self._send(self._link.send_audio, chunk) if self._link_ok else False
                # unsent (the link is down): the audio falls into the Gap reported on reconnect
                self._core.clock.fed(chunk.size, sent=sent)
            self._check_open()

    def events(self) -> AsyncIterator[RecognizerEvent]:
        return self._iter_events()

    async def flush(self, until_s: float) -> None:
        async with self._flush_slots:
            loop = asyncio.get_running_loop()
            while True:
                self._check_open()
                await self._connected.wait()
                async with self._send_lock:
                    self._check_open()
                    if not self._link_ok:
                        continue  # lost meanwhile: wait for the next link
                    plan = self._core.plan_flush(until_s)
                    done = self._waiters[plan.marker_id] = loop.create_future()
                    await self._send_flush(plan)  # lost mid-way: re-planned on the next link
                    break
            await done

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        with contextlib.suppress(Exception):
            await self._link.close()
        self._end(RecognizerFailed(f"{self.name}: stream closed before the flush completed"))

    # ---- sending ---------------------------------------------------------------------------
    async def _send(self, fn, arg) -> bool:
        try:
            await fn(arg)
            return True
        except LinkLost:
            self._link_ok = False  # the reader sees the loss too and reconnects
            self._connected.clear()  # flush waits for the new link instead of spinning
            return False

    async def _send_silence(self, n: int) -> bool:
        while n > 0:
            k = min(n, MAX_CHUNK)
            if not await self._send(self._link.send_audio, np.zeros(k, np.float32)):
                return False
            self._core.clock.inserted(k)
            n -= k
        return True

    async def _send_flush(self, plan: FlushPlan) -> None:
        """Under the send lock."""
        if (await self._send_silence(plan.silence_before) and await self._send(self._link.send_marker, plan.marker_id)):
            await self._send_silence(plan.silence_after)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RecognizerFailed(f"{self.name}: stream is closed")

    # ---- reading ---------------------------------------------------------------------------
    async def _iter_events(self):
        while True:
            if self._ended and self._events.empty():
                break
            item = await self._events.get()
            if item is _END:
                break
            yield item
        if self._failure is not None and not self._closed:
            raise self._failure

    async def _run(self) -> None:
        try:
            while True:
                try:
                    msgs = await self._link.receive()
                except LinkLost as lost:
                    await self._relink(lost)
                    continue
                for msg in msgs:
                    if isinstance(msg, Error):
                        self._last_error = msg.message
                        log.warning("%s: recognizer error: %s", self.name, msg.message)
                        continue
                    for ev in self._core.on_message(msg):
                        await self._emit(ev)
        except asyncio.CancelledError:
            raise
        except RecognizerFailed as e:
            self._end(e)
        except Exception as e:  # a bug or an unexpected server: fail the stream, never hang it
            log.exception("%s: stream reader failed", self.name)
            self._end(RecognizerFailed(f"{self.name}: {type(e).__name__}: {e}"))

    async def _emit(self, ev) -> None:
        if isinstance(ev, FlushDone):
            fut = self._waiters.pop(ev.marker_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        else:
            await self._events.put(ev)  # bounded: a slow reader holds the recognizer back

    async def _relink(self, lost: LinkLost) -> None:
        reason = lost.reason
        if self._last_error and self._last_error not in reason:
            reason = f"{reason} (after: {self._last_error})"
        evicted = "evicted" in (self._last_error or "")
        async with self._send_lock:
            self._link_ok = False
            self._connected.clear()
            old = self._link
            closing = self._core.link_lost()
        with contextlib.suppress(Exception):
            await old.close()
        for ev in closing:
            await self._emit(ev)
        if self._reopen is None or lost.final or evicted:
            raise RecognizerFailed(f"{self.name}: {reason}")
        log.warning("%s: recognizer link lost (%s); reconnecting", self.name, reason)
        try:
            new = await self._reopen(old)
        except (RecognizerFailed, RuntimeError) as e:  # RecognizerUnavailable is a RuntimeError
            raise RecognizerFailed(f"{self.name}: lost ({reason}) and could not reconnect: {e}") from None
        async with self._send_lock:
            self._link, self._link_ok, self._last_error = new, True, None
            gap, again = self._core.link_restored(reason)
            for old_id, until_s in again:  # flushes the lost link never answered
                plan = self._core.plan_flush(until_s)
                if old_id in self._waiters:
                    self._waiters[plan.marker_id] = self._waiters.pop(old_id)
                await self._send_flush(plan)
            self._connected.set()
        self.gaps += 1
        g = gap[0]
        self.gap_seconds += max(0.0, g.end_s - g.start_s)
        if self._on_gap is not None:
            self._on_gap(g)
        log.warning("%s: reconnected; audio %.2f-%.2f s reached no recognizer", self.name, g.start_s, g.end_s)
        for ev in gap:
            await self._emit(ev)

    def _end(self, failure: RecognizerFailed) -> None:
        """Stop for good: fail the pending flushes, wake waiters, end events()."""
        if not self._closed and self._failure is None:
            self._failure = failure
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(failure)
        self._waiters.clear()
        self._connected.set()
        self._link_ok = False
        if not self._ended:
            self._ended = True
            with contextlib.suppress(asyncio.QueueFull):  # full: events() ends once drained
                self._events.put_nowait(_END)
