"""The embedded Whisper recognizer behind the moshi-server protocol (`duplex asr-serve --model whisper-tiny.en`).

Implements the scheduler's `Recognizer` / `RecognizerSession` hooks (asr.engine.scheduler) for
`asr.whisper.WhisperRecognizer`, so `asr.serving.server.AsrServer` serves it unchanged:

- input: float32 PCM at 24 kHz, resampled to 16 kHz by a streaming soxr resampler (its output
  is aligned with its input, so the 16 kHz sample count is the stream clock);
- segmentation: Silero VAD on 32 ms windows (one ONNX session shared by all streams, a
  recurrent state per stream; or any VAD injected with `vad_factory`). An utterance starts at
  the first speech window (plus `pre_roll_s` before it) and ends after `min_silence_s` of
  non-speech, or when it reaches Whisper's utterance capacity;
- output: at each utterance end the utterance is decoded with word timestamps and every word
  is sent as `Word(text, start_time)` + `EndWord(stop_time)`, times in seconds from the first
  sample of the stream; a `Step` per 80 ms of audio processed, whose `prs` holds the latest
  Silero speech probability;
- `Marker`: echoed once all audio sent before it has gone through the VAD and no utterance that
  began before it is still open, i.e. after every word for that audio. Keep sending audio
  (silence) after a marker, or send `Flush`.

All model work (resampling, VAD, Whisper decodes) runs in a small thread pool, never on the
event loop; one Whisper model serves every connection (it serialises decodes with its lock).
Memory per stream is bounded: the input buffer (`buffer_seconds`, the same backpressure as the
engine scheduler), Whisper's preallocated utterance buffer, the pre-roll ring, the output
queue (a stream whose client does not read is not processed) and the pending markers.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import soxr

from asr.base import SPEECH_RATE as WHISPER_RATE
from asr.moshi_protocol import FRAME_SIZE as STEP_IN  # 80 ms at 24 kHz: one moshi step
from asr.moshi_protocol import SAMPLE_RATE as IN_RATE
from asr.moshi_protocol import EndWord, MarkerReply, ServerMessage, Step, Word
from asr.engine.scheduler import BufferedSession, ServiceShell
from asr.vad import FRAME as VAD_WINDOW  # Silero's window at 16 kHz (32 ms)
from asr.vad import SileroVAD
from asr.whisper import UtteranceDecoder, WhisperRecognizer

STEP_16K = STEP_IN * WHISPER_RATE // IN_RATE  # 1280

# A VAD stream: fed 16 kHz float32 samples, returns one speech probability per completed
# 512-sample window (the i-th value scores stream samples [512 i, 512 (i + 1))). This is the
# interface of asr.vad.SileroStream, the default.
VadStream = Callable[[np.ndarray], Sequence[float]]
VadFactory = Callable[[], VadStream]


# ---- configuration -------------------------------------------------------------------------------
@dataclass
class WhisperServiceConfig:
    max_sessions: int = 8  # concurrent streams (`--slots`)
    buffer_seconds: float = 10.0  # per-session input cap (24 kHz samples held, not yet processed)
    admission_wait_s: float = 0.0
    idle_timeout_s: float = 120.0
    max_session_s: float = 4 * 3600.0
    out_queue_max: int = 256
    max_pending_markers: int = 64
    chunk_seconds: float = 0.48  # audio handed to the worker per call
    workers: int = 2  # threads for resampling / VAD / decodes (decodes are serialised anyway)
    vad_threshold: float = 0.5  # a window at or above this starts (or continues) speech
    vad_off_threshold: float = 0.35  # below this a window counts as silence
    min_silence_s: float = 0.5  # silence that ends an utterance
    min_speech_s: float = 0.15  # shorter utterances are dropped undecoded (clicks, breaths)
    pre_roll_s: float = 0.3  # audio kept before the first speech window
    post_roll_s: float = 0.2  # audio kept after the last speech window
    flush_silence_s: float = 1.0  # silence a Flush appends (ends any open utterance)


# ---- the per-stream pipeline (worker-thread side) --------------------------------------------------
class _Pipeline:
    """Resampler + VAD segmentation + Whisper stream for one connection. Not thread-safe: the
    session runs one `process` call at a time. Reads of `scored`/`utt_start` happen on the event
    loop between calls."""

    def __init__(self, stream: UtteranceDecoder, vad: VadStream, cfg: WhisperServiceConfig):
        self.cfg, self.stream, self.vad = cfg, stream, vad
        self.rs = soxr.ResampleStream(IN_RATE, WHISPER_RATE, 1, dtype="float32", quality="HQ")
        self.unscored = np.zeros(0, np.float32)  # 16 kHz samples handed to the VAD, not yet scored
        self.scored = 0  # 16 kHz samples scored by the VAD: the stream position (clock)
        pre = max(VAD_WINDOW, int(cfg.pre_roll_s * WHISPER_RATE) // VAD_WINDOW * VAD_WINDOW)
        self.ring = np.zeros(pre, np.float32)  # the last `pre` scored samples
        self.ring_fill = 0
        self.utt_start: int | None = None  # 16 kHz position where the open utterance begins
        self.last_speech_end = 0
        self.speech_windows = 0
        self.silence_windows = 0
        self.steps = 0
        self.last_prob = 0.0
        self.last_word_start = 0.0
        self.utterances = 0
        self._silence_end = math.ceil(cfg.min_silence_s * WHISPER_RATE / VAD_WINDOW)
        self._cap = int(stream.capacity_seconds * WHISPER_RATE) - VAD_WINDOW

    def process(self, pcm24: np.ndarray) -> list[ServerMessage]:
        out: list[ServerMessage] = []
        x = self.rs.resample_chunk(np.asarray(pcm24, np.float32))
        self.unscored = np.concatenate([self.unscored, x]) if self.unscored.size else x
        probs = self.vad(x)
        for i, p in enumerate(probs):
            self._window(self.unscored[i * VAD_WINDOW:(i + 1) * VAD_WINDOW], float(p), out)
        self.unscored = self.unscored[len(probs) * VAD_WINDOW:].copy()
        return out

    def _window(self, w: np.ndarray, p: float, out: list[ServerMessage]) -> None:
        cfg, t = self.cfg, self.scored
        self.last_prob = p
        if self.utt_start is None:
            if p >= cfg.vad_threshold:
                start = t - self.ring_fill
                self.stream.reset(start_s=start / WHISPER_RATE)
                if self.ring_fill:
                    self.stream.push(self.ring[-self.ring_fill:])
                self.stream.push(w)
                self.utt_start, self.last_speech_end = start, t + w.size
                self.speech_windows, self.silence_windows = 1, 0
        else:
            if (t + w.size) - self.utt_start > self._cap:  # Whisper's buffer is full: cut here
                self._end_utterance(out, pushed=t - self.utt_start, whole=True)
                self.stream.reset(start_s=t / WHISPER_RATE)
                self.utt_start, self.last_speech_end = t, t
                self.speech_windows = self.silence_windows = 0
            self.stream.push(w)
            if p >= cfg.vad_off_threshold:
                self.speech_windows += 1
                self.silence_windows = 0
                self.last_speech_end = t + w.size
            else:
                self.silence_windows += 1
                if self.silence_windows >= self._silence_end:
                    self._end_utterance(out, pushed=t + w.size - self.utt_start)
        # the pre-roll ring always holds the latest scored audio
        self.ring = np.roll(self.ring, -w.size)
        self.ring[-w.size:] = w
        self.ring_fill = min(self.ring.size, self.ring_fill + w.size)
        self.scored = t + w.size
        while (self.steps + 1) * STEP_16K <= self.scored:
            self.steps += 1
            out.append(Step(self.steps, (round(self.last_prob, 4),)))

    def _end_utterance(self, out: list[ServerMessage], pushed: int, whole: bool = False) -> None:
        """Decode the open utterance (`pushed` samples so far) and emit its words."""
        start = self.utt_start
        self.utt_start = None
        assert start is not None
        if self.speech_windows * VAD_WINDOW < self.cfg.min_speech_s * WHISPER_RATE:
            self.stream.reset()
            return
        n = pushed if whole else min(pushed, self.last_speech_end - start + int(self.cfg.post_roll_s * WHISPER_RATE))
        hyp = self.stream.finalize(n)
        self.utterances += 1
        lo = start / WHISPER_RATE
        hi = lo + n / WHISPER_RATE
        for w in hyp.words:
            text = w.text.strip()
            if not text:
                continue
            s = min(max(w.start, lo, self.last_word_start), hi)
            e = min(max(w.end, s), hi)
            self.last_word_start = s
            out.append(Word(text, s))
            out.append(EndWord(e))


# ---- sessions (event-loop side) ------------------------------------------------------------------
class WhisperSession(BufferedSession):
    """One client stream: bounded input buffer, a worker task, markers and an output queue."""

    def __init__(self, service: WhisperService, pipeline: _Pipeline):
        self._svc, self._pipe = service, pipeline
        cfg = service.config
        self._init_buffers(int(math.ceil(cfg.buffer_seconds * IN_RATE / STEP_IN)) * STEP_IN, cfg.max_pending_markers)
        self._chunk = max(STEP_IN, int(cfg.chunk_seconds * IN_RATE) // STEP_IN * STEP_IN)
        self._work = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="asr-whisper-session")

    def _wake_worker(self) -> None:
        self._work.set()

    # ---- client side (RecognizerSession) ---------------------------------------------------------
    async def mark(self, marker_id: int) -> None:
        # targets are input samples: due once everything before them is scored and decoded
        if self._add_marker(self._received, marker_id):
            self._resolve_markers()

    async def flush(self) -> None:
        await self._feed_silence(int(self._svc.config.flush_silence_s * IN_RATE))

    async def close(self) -> None:
        self._svc._release(self, "closed by client")

    # ---- worker --------------------------------------------------------------------------------
    def _resolve_markers(self) -> None:
        """A marker is due once the VAD has scored all audio before it and no utterance that
        began before it is still open (its words have been sent)."""
        p = self._pipe
        scored_in = p.scored * IN_RATE // WHISPER_RATE
        open_in = None if p.utt_start is None else p.utt_start * IN_RATE // WHISPER_RATE
        while self._markers:
            target, mid = self._markers[0]
            if scored_in < target or (open_in is not None and open_in < target):
                break
            self._markers.popleft()
            self._push(MarkerReply(mid))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self._svc.config
        try:
            while not self.closed:
                if self._len == 0 or len(self._out) >= cfg.out_queue_max:
                    self._work.clear()
                    await self._work.wait()
                    continue
                chunk = self._take(min(self._len, self._chunk)).copy()
                msgs = await loop.run_in_executor(self._svc._executor, self._svc._timed, self._pipe.process, chunk)
                if self.closed:
                    return
                for m in msgs:
                    self._push(m)
                self._resolve_markers()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a model failure ends this stream, not the server
            self._svc._release(self, f"recognizer failed: {e!r}", error=f"recognizer failed: {type(e).__name__}")


class WhisperService(ServiceShell):
    """Serves `WhisperRecognizer` streams; implements `asr.engine.scheduler.Recognizer`."""

    sample_rate = IN_RATE

    def __init__(self, recognizer: WhisperRecognizer, config: WhisperServiceConfig | None = None,
                 vad_factory: VadFactory | None = None):
        self.recognizer = recognizer
        self.config = config or WhisperServiceConfig()
        self.name = f"{recognizer.name} (embedded Whisper)"
        self._vad_factory = vad_factory
        self._sessions: list[WhisperSession] = []
        self._freed = asyncio.Event()
        self._executor = ThreadPoolExecutor(max(1, self.config.workers), thread_name_prefix="asr-whisper")
        self.compute_seconds = 0.0  # worker time on stream audio (asr.serving.server's real-time factor)
        self.audio_seconds = 0.0  # stream audio that went through it, summed over streams
        self._stats_lock = threading.Lock()

    def _timed(self, process, chunk: np.ndarray):
        """Worker thread: `process(chunk)`, its time and audio counted."""
        t0 = time.perf_counter()
        try:
            return process(chunk)
        finally:
            dt = time.perf_counter() - t0
            with self._stats_lock:
                self.compute_seconds += dt
                self.audio_seconds += chunk.size / IN_RATE

    @property
    def batch_size(self) -> int:
        return self.config.max_sessions

    @property
    def sessions(self) -> list[WhisperSession]:
        return list(self._sessions)

    _background_name = "asr-whisper-sweeper"

    async def start(self) -> None:
        if self._vad_factory is None:
            self._vad_factory = SileroVAD().new_stream
        await super().start()

    async def _background(self) -> None:
        await self._sweep()

    async def open_session(self) -> WhisperSession:
        if self._vad_factory is None:
            await self.start()
        await self._wait_for_slot(lambda: len(self._sessions) < self.config.max_sessions,
                                  self.config.max_sessions, self.config.admission_wait_s)
        assert self._vad_factory is not None
        pipe = _Pipeline(self.recognizer.open_decoder(), self._vad_factory(), self.config)
        session = WhisperSession(self, pipe)
        self._sessions.append(session)
        return session

    def _release(self, session: WhisperSession, reason: str, error: str | None = None) -> None:
        session._close(reason, error)
        if session in self._sessions:
            self._sessions.remove(session)
            self._freed.set()
        task = session._task
        if task is not asyncio.current_task() and not task.done():
            task.cancel()  # a decode already running finishes in its thread; its result is dropped

    async def _sweep(self) -> None:
        cfg = self.config
        while True:
            now = time.monotonic()
            for s in self.sessions:
                if now - s.opened_at > cfg.max_session_s:
                    self._release(s, "max session length", error="session evicted: maximum session length reached")
                elif now - s.last_input > cfg.idle_timeout_s and s._len == 0:
                    self._release(s, "idle timeout", error="session evicted: idle timeout")
            await asyncio.sleep(0.25)
