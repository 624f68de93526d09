"""Admission, per-slot buffers and the tick loop that feeds the batched engine.

All bookkeeping runs on the asyncio event loop; only `engine.step` runs in a worker thread, so
the loop keeps reading sockets while the model computes. Memory is bounded everywhere:
- each session's input buffer holds at most `buffer_seconds` of audio; `feed` waits for room,
  so a server that awaits `feed` before reading more stops reading that socket and TCP pushes
  back on the client;
- each session's output queue is bounded: a slot whose client does not read its results is
  not stepped until the queue drains;
- pending markers per session are capped.
A slot is reused by the next session at once; a generation id per slot drops results that a
step computed for the previous owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from asr.engine.kyutai import LoadedModel, WordAssembler, WordEnd, WordStart
from asr.moshi_protocol import SAMPLE_RATE, EndWord, Error, MarkerReply, ServerMessage, Step, Word


class NoFreeSlot(RuntimeError):
    """Every slot of the pool is taken (and the optional admission wait ran out)."""


class SessionClosed(RuntimeError):
    """The session was closed or evicted; the reason is in the message."""


class RecognizerSession(Protocol):
    """One client stream, as the server sees it."""

    @property
    def buffered_samples(self) -> int: ...

    async def feed(self, pcm: np.ndarray) -> None:
        """Append float32 samples at 24 kHz; waits while the input buffer is full."""

    async def mark(self, marker_id: int) -> None:
        """Echo `MarkerReply(marker_id)` once all audio sent before it has been transcribed."""

    async def flush(self) -> None:
        """End of stream: push enough silence through to get the last words out."""

    async def messages(self) -> list[ServerMessage]:
        """Wait for output; an empty list means the session is closed and drained."""

    async def close(self) -> None: ...


class Recognizer(Protocol):
    """What `asr.serving.server` serves. The engine scheduler is one; an embedded recognizer can be another."""

    name: str
    sample_rate: int

    async def open_session(self) -> RecognizerSession:
        """A new stream; raises NoFreeSlot when there is no capacity."""


@dataclass
class SchedulerConfig:
    buffer_seconds: float = 10.0  # per-session input cap
    admission_wait_s: float = 0.0  # 0: refuse at once when full; > 0: wait up to this long
    idle_timeout_s: float = 120.0  # no input for this long (and nothing left to do): evict
    max_session_s: float = 4 * 3600.0
    out_queue_max: int = 256  # queued results per session before its slot pauses
    max_pending_markers: int = 64
    flush_extra_frames: int = 2  # silence after the ASR delay when flushing
    # a frame waits at most this long for the frames of the other streams arriving in real time,
    # so that they share one batched step per frame instead of each stepping alone (0: never)
    batch_wait_s: float = 0.08
    sample_rate: int = SAMPLE_RATE


class BufferedSession:
    """The client side every recognizer session shares: a bounded input buffer whose `feed`
    waits for room (TCP backpressure), an output queue, pending markers and closing.

    Subclasses call `_init_buffers`, implement `_wake_worker()` (new input or output room) and
    `close()`, and take audio with `_take(n)`."""

    def _init_buffers(self, capacity: int, max_pending_markers: int) -> None:
        self.capacity = capacity
        self._max_markers = max_pending_markers
        self._buf = np.zeros(capacity, np.float32)
        self._start = 0
        self._len = 0
        self._received = 0  # input samples accepted so far
        self._room = asyncio.Event()
        self._out: deque[ServerMessage] = deque()
        self._has_out = asyncio.Event()
        self._markers: deque[tuple[int, int]] = deque()  # (target, id), target in subclass units
        self.opened_at = self.last_input = time.monotonic()
        self.closed_reason: str | None = None
        self.max_buffered = 0  # high-water mark, for tests and benchmarks

    def _wake_worker(self) -> None:
        raise NotImplementedError

    @property
    def buffered_samples(self) -> int:
        return self._len

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    async def feed(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        if pcm.size > self.capacity:
            raise ValueError(f"at most {self.capacity} samples per call")
        self.last_input = time.monotonic()
        while self.capacity - self._len < pcm.size:
            if self.closed:
                raise SessionClosed(self.closed_reason)
            self._room.clear()
            await self._room.wait()
        if self.closed:
            raise SessionClosed(self.closed_reason)
        if self._start + self._len + pcm.size > self.capacity:  # compact; O(capacity), rare
            self._buf[:self._len] = self._buf[self._start:self._start + self._len]
            self._start = 0
        end = self._start + self._len
        self._buf[end:end + pcm.size] = pcm
        self._len += pcm.size
        self._received += pcm.size
        self.max_buffered = max(self.max_buffered, self._len)
        self.last_input = time.monotonic()
        self._wake_worker()

    async def _feed_silence(self, n: int) -> None:
        while n > 0:
            k = min(n, self.capacity)
            await self.feed(np.zeros(k, np.float32))
            n -= k

    def _add_marker(self, target: int, marker_id: int) -> bool:
        """Queue a marker; False (and an Error message) when too many are pending."""
        if self.closed:
            raise SessionClosed(self.closed_reason)
        self.last_input = time.monotonic()
        if len(self._markers) >= self._max_markers:
            self._push(Error(f"too many pending markers (max {self._max_markers})"))
            return False
        self._markers.append((target, marker_id))
        return True

    async def messages(self) -> list[ServerMessage]:
        while not self._out:
            if self.closed:
                return []
            self._has_out.clear()
            await self._has_out.wait()
        out = list(self._out)
        self._out.clear()
        self._wake_worker()  # a worker paused on a full output queue may run again
        return out

    def _take(self, n: int) -> np.ndarray:
        """The next `n` buffered samples (a view, valid until the next feed)."""
        chunk = self._buf[self._start:self._start + n]
        self._start += n
        self._len -= n
        if self._len == 0:
            self._start = 0
        self._room.set()
        return chunk

    def _push(self, msg: ServerMessage) -> None:
        self._out.append(msg)
        self._has_out.set()

    def _close(self, reason: str, error: str | None = None) -> None:
        if self.closed:
            return
        if error:
            self._push(Error(error))
        self.closed_reason = reason
        self._room.set()
        self._has_out.set()
        self._wake_worker()


class EngineSession(BufferedSession):
    """A stream bound to one engine slot."""

    def __init__(self, sched: EngineScheduler, slot: int, gen: int):
        self._sched, self.slot, self.gen = sched, slot, gen
        cfg = sched.config
        frame = sched.frame_size
        self._init_buffers(int(math.ceil(cfg.buffer_seconds * cfg.sample_rate / frame)) * frame,
                           cfg.max_pending_markers)
        self.frames_done = 0
        self.needs_reset = True
        self.words = WordAssembler(sched.model.asr_delay_frames, sched.model.decode)

    def _wake_worker(self) -> None:
        self._sched._wake.set()

    async def mark(self, marker_id: int) -> None:
        # every frame received so far, the one a step in flight holds included (frames_done does
        # not count it yet, and the buffer no longer has it)
        frames = -(-self._received // self._sched.frame_size)
        self._add_marker(frames + self._sched.model.asr_delay_frames, marker_id)

    async def flush(self) -> None:
        frame = self._sched.frame_size
        partial = self._len % frame
        if partial:
            await self.feed(np.zeros(frame - partial, np.float32))
        await self._feed_silence((self._sched.model.asr_delay_frames + self._sched.config.flush_extra_frames) * frame)

    async def close(self) -> None:
        self._sched._release(self, "closed by client")

    # ---- scheduler side --------------------------------------------------------------------
    def _has_frame(self) -> bool:
        return self._len >= self._sched.frame_size and len(self._out) < self._sched.config.out_queue_max

    def _pop_frame(self, into: np.ndarray) -> None:
        into[:] = self._take(self._sched.frame_size)

    def _on_token(self, token: int, position: int) -> None:
        for ev in self.words.push(token, position):
            if isinstance(ev, WordStart):
                self._push(Word(ev.text, ev.start_time))
            elif isinstance(ev, WordEnd):
                self._push(EndWord(ev.stop_time))
        if position > 0:
            self.frames_done += 1
            self._push(Step(self.frames_done))
        while self._markers and self._markers[0][0] <= self.frames_done:
            self._push(MarkerReply(self._markers.popleft()[1]))


class ServiceShell:
    """What every `Recognizer` service shares: one background task (tick loop or sweeper), a
    worker pool, `async with` support, and waiting for a free slot with a deadline.

    Subclasses set `_executor`, `_freed` (set when a slot frees) and `_background_name`, and
    implement `_background()`, `sessions` and `_release()`."""

    _background_name = "asr-service"
    _background_task: asyncio.Task | None = None

    async def _background(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self._background_task is None:
            self._background_task = asyncio.create_task(self._background(), name=self._background_name)

    async def stop(self) -> None:
        for s in self.sessions:
            self._release(s, "server stopping", error="server stopping")
        if self._background_task is not None:
            self._background_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._background_task
            self._background_task = None
        self._executor.shutdown(wait=True)

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _wait_for_slot(self, has_free: Callable[[], bool], capacity: int, wait_s: float) -> None:
        """Return once `has_free()`; raise `NoFreeSlot` when `wait_s` passes first."""
        deadline = time.monotonic() + wait_s
        while not has_free():
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoFreeSlot(f"no free slot: all {capacity} slots are busy")
            self._freed.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that comes as the
            # slot frees, and a caller that has gone would then take the slot
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._freed.wait()


class EngineScheduler(ServiceShell):
    """Runs a `StreamingEngine` for many sessions; implements `Recognizer`."""

    def __init__(self, model: LoadedModel, config: SchedulerConfig | None = None):
        self.model, self.engine = model, model.engine
        self.config = config or SchedulerConfig()
        self.name = model.name
        self.sample_rate = self.config.sample_rate
        self.frame_size = self.engine.frame_size
        B = self.engine.batch_size
        self._free = list(range(B))
        heapq.heapify(self._free)
        self._owner: list[EngineSession | None] = [None] * B
        self._gen = [0] * B
        self._pcm = np.zeros((B, self.frame_size), np.float32)
        self._wake = asyncio.Event()
        self._freed = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asr-engine")
        self._ready_since: float | None = None  # when a frame first waited for the next step
        self.ticks = 0
        self.step_seconds: deque[float] = deque(maxlen=4096)  # recent step durations
        self.compute_seconds = 0.0  # all steps' time (asr.serving.server's real-time factor)
        self.active_rows: deque[int] = deque(maxlen=4096)  # rows stepped per recent tick: batching achieved

    @property
    def batch_size(self) -> int:
        return self.engine.batch_size

    @property
    def audio_seconds(self) -> float:
        """Stream time the steps advanced (each step: one frame of every live stream)."""
        return self.ticks * self.frame_size / self.sample_rate

    @property
    def sessions(self) -> list[EngineSession]:
        return [s for s in self._owner if s is not None]

    _background_name = "asr-tick-loop"

    async def _background(self) -> None:
        await self._run()

    # ---- admission -------------------------------------------------------------------------
    async def open_session(self) -> EngineSession:
        await self._wait_for_slot(lambda: bool(self._free), self.batch_size, self.config.admission_wait_s)
        slot = heapq.heappop(self._free)
        self._gen[slot] += 1
        session = EngineSession(self, slot, self._gen[slot])
        self._owner[slot] = session
        session._on_token(self.engine.bos_token, 0)
        return session

    def _release(self, session: EngineSession, reason: str, error: str | None = None) -> None:
        session._close(reason, error)
        if self._owner[session.slot] is session:
            self._owner[session.slot] = None
            heapq.heappush(self._free, session.slot)
            self._freed.set()

    def _evict_expired(self, now: float) -> None:
        cfg = self.config
        for s in self.sessions:
            if now - s.opened_at > cfg.max_session_s:
                self._release(s, "max session length", error="session evicted: maximum session length reached")
            elif now - s.last_input > cfg.idle_timeout_s and not s._has_frame():
                self._release(s, "idle timeout", error="session evicted: idle timeout")

    # ---- tick loop -------------------------------------------------------------------------
    def _gather(self):
        active = np.zeros(self.batch_size, bool)
        reset, dispatched = [], []
        for slot, s in enumerate(self._owner):
            if s is None or not s._has_frame():
                continue
            s._pop_frame(self._pcm[slot])
            active[slot] = True
            if s.needs_reset:
                reset.append(slot)
                s.needs_reset = False
            dispatched.append((slot, s, self._gen[slot]))
        return active, reset, dispatched

    def _timed_step(self, active, reset):
        t0 = time.perf_counter()
        tokens = self.engine.step(self._pcm, active, reset=reset)
        dt = time.perf_counter() - t0
        self.step_seconds.append(dt)
        self.compute_seconds += dt
        return tokens

    def _batch_wait(self, now: float) -> float:
        """Seconds to wait for more frames before stepping (0: step now). Streams fed in real
        time fill their frames at different moments; waiting for them (up to `batch_wait_s`)
        steps them together. A stream with a backlog (a flush, a client catching up) goes at once."""
        wait, frame = self.config.batch_wait_s, self.frame_size
        if wait <= 0:
            return 0.0
        sessions = self.sessions
        if any(s._len >= 2 * frame for s in sessions if s._has_frame()):
            return 0.0
        fed_recently = 2 * frame / self.config.sample_rate
        coming = [s for s in sessions if s._len < frame and not s.closed and now - s.last_input < fed_recently]
        if not coming:
            return 0.0
        if self._ready_since is None:
            self._ready_since = now
        return max(0.0, self._ready_since + wait - now)

    async def _idle(self, timeout: float) -> None:
        self._wake.clear()
        # not wait_for: on Python 3.11 it swallows a cancel that lands as the event is set
        # (close() then stop()), and stop() would wait for this loop forever
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = time.monotonic()
            self._evict_expired(now)
            if not any(s._has_frame() for s in self.sessions):
                self._ready_since = None
                await self._idle(0.25)
                continue
            wait = self._batch_wait(now)
            if wait > 0:
                await self._idle(wait)
                continue
            self._ready_since = None
            active, reset, dispatched = self._gather()
            tokens = await loop.run_in_executor(self._executor, self._timed_step, active, reset)
            self.ticks += 1
            self.active_rows.append(len(dispatched))
            for slot, s, gen in dispatched:
                if self._owner[slot] is s and self._gen[slot] == gen and not s.closed:
                    s._on_token(int(tokens[slot]), s.frames_done + 1)
            await asyncio.sleep(0)  # let readers and writers run between ticks
