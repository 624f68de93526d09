"""One conversation: transport audio in -> VAD/turns -> ASR -> LLM -> TTS -> paced playout out.

Stages run concurrently (`mode="concurrent"`): LLM tokens go to TTS at clause boundaries while
the LLM still generates, and audio goes out while later sentences are synthesized. The same code
runs them strictly one after another when `mode="waterfall"` (for latency comparisons).
Every model call runs in a worker thread; every queue is bounded.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from agent.profiling import profile_region
from agent.trace import NullTracer, Tracer
from agent.turns import BargeIn, EndOfTurn, StartUtterance, State, TurnConfig, TurnMachine
from asr.base import Hypothesis, StreamingRecognizer
from llm.base import ChatModel, Message
from transport.audio import StreamResampler, float_to_int16
from transport.base import AudioIn, AudioOut, ClientEvent, Played, Transport
from tts.base import AudioChunk, Synthesizer
from tts.chunking import TextChunker

log = logging.getLogger("duplex.session")
ASR_RATE = 16000
VAD_FRAME_S = 512 / ASR_RATE

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Reply in one or two short, plain English sentences.")


@dataclass
class SessionConfig:
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    mode: str = "concurrent"  # "concurrent" | "waterfall"
    turns: TurnConfig = field(default_factory=TurnConfig)
    max_history_messages: int = 16
    max_tokens: int = 80
    playout_lead_s: float = 0.4  # audio sent ahead of real time; bounds the far end's buffer
    piece_s: float = 0.1  # size of each audio message
    text_queue: int = 8  # LLM -> TTS chunks in flight
    asr_queue: int = 1024  # audio chunks waiting for the recognizer (~20 s of 20 ms frames)


@dataclass
class Models:
    asr: StreamingRecognizer
    llm: ChatModel
    tts: Synthesizer
    vad_factory: Callable[[], object]  # -> a callable scoring 16 kHz audio into 32 ms frame probs


@dataclass
class TurnRecord:
    """What happened in one user turn, with time.perf_counter() times (seconds)."""

    index: int
    speech_end: float = 0.0
    endpoint: float = 0.0
    asr_final: float = 0.0
    llm_first_token: float = 0.0
    tts_first_chunk: float = 0.0
    first_audio_out: float = 0.0
    user_text: str = ""
    reply_text: str = ""
    heard_text: str = ""
    interrupted: bool = False
    mouth_to_ear_ms: float | None = None  # measured in the page, when the transport has one
    tokens: list[str] = field(default_factory=list, repr=False)

    @property
    def voice_to_voice(self) -> float | None:
        return self.first_audio_out - self.speech_end if self.first_audio_out else None

    def summary(self) -> dict:
        ms = lambda a, b: round((a - b) * 1000, 1) if a and b else None  # noqa: E731
        return {
            "turn": self.index, "user": self.user_text, "reply": self.reply_text,
            "heard": self.heard_text, "interrupted": self.interrupted,
            "endpoint_ms": ms(self.endpoint, self.speech_end),
            "asr_final_ms": ms(self.asr_final, self.endpoint),
            "llm_ttft_ms": ms(self.llm_first_token, self.asr_final),
            "tts_first_chunk_ms": ms(self.tts_first_chunk, self.llm_first_token),
            "voice_to_voice_ms": ms(self.first_audio_out, self.speech_end),
            "mouth_to_ear_ms": self.mouth_to_ear_ms,
        }


class Playout:
    """Sends reply audio in small pieces, at most `lead_s` ahead of real time, and remembers
    which text each piece speaks so the words the user actually heard are known."""

    def __init__(self, transport: Transport, lead_s: float, piece_s: float, new_id: Callable[[], int]):
        self.transport, self.lead_s, self.piece_s = transport, lead_s, piece_s
        self._new_id = new_id  # chunk ids are unique for the whole session
        self.t0: float | None = None
        self.sent_s = 0.0
        self.pieces: list[tuple[int, float, str]] = []  # (chunk_id, offset_s, text)
        self.played_ids: set[int] = set()

    async def play(self, chunk: AudioChunk) -> None:
        for pcm, text in split_chunk(chunk, self.piece_s):
            if self.t0 is None:
                self.t0 = time.perf_counter()
            ahead = self.sent_s - (time.perf_counter() - self.t0)
            if ahead > self.lead_s:
                await asyncio.sleep(ahead - self.lead_s)
            cid = self._new_id()
            self.pieces.append((cid, self.sent_s, text))
            await self.transport.send_audio(AudioOut(pcm, chunk.sample_rate, cid, text))
            self.sent_s += pcm.size / chunk.sample_rate

    async def wait_played(self) -> None:
        if self.t0 is not None:
            remaining = self.t0 + self.sent_s - time.perf_counter()
            if remaining > 0:
                await asyncio.sleep(remaining)

    def heard_text(self, use_marks: bool) -> str:
        """Text of the pieces the far end started playing (its marks), else those whose time came."""
        if use_marks:
            said = [t for cid, _, t in self.pieces if cid in self.played_ids]
        else:
            elapsed = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
            said = [t for _, off, t in self.pieces if off <= elapsed]
        return " ".join(t for t in said if t).strip()


def split_chunk(chunk: AudioChunk, piece_s: float) -> list[tuple[np.ndarray, str]]:
    """Cut a chunk into pieces of about `piece_s`, sharing its words out in proportion to time."""
    step = max(1, int(piece_s * chunk.sample_rate))
    n = max(1, -(-chunk.pcm.size // step))
    words = chunk.text.split()
    out = []
    for i in range(n):
        w0, w1 = (i * len(words)) // n, ((i + 1) * len(words)) // n
        out.append((chunk.pcm[i * step:(i + 1) * step], " ".join(words[w0:w1])))
    return out


class Session:
    def __init__(self, models: Models, transport: Transport, config: SessionConfig | None = None,
                 tracer=None, session_id: str = "s0"):
        self.models, self.transport = models, transport
        self.config = config or SessionConfig()
        self.tracer: Tracer = tracer if tracer is not None else NullTracer(session_id)
        self.session_id = session_id
        self.turns = TurnMachine(self.config.turns)
        self.history: list[Message] = []
        self.records: list[TurnRecord] = []
        self._vad = models.vad_factory()
        self._asr = models.asr.open_stream()
        self._resampler: StreamResampler | None = None
        self._t_audio = 0.0  # stream time: seconds of 16 kHz audio received
        self._wall_at_t = time.perf_counter()
        self._preroll: deque[np.ndarray] = deque()
        self._preroll_n = 0
        self._utterance_active = False
        self._asr_q: asyncio.Queue = asyncio.Queue(maxsize=self.config.asr_queue)
        self._reply_task: asyncio.Task | None = None
        self._playout: Playout | None = None
        self._chunk_ids = itertools.count()
        self._closed = asyncio.Event()

    # ---- clocks ---------------------------------------------------------------------------
    def wall_of(self, t_stream: float) -> float:
        """Monotonic wall time at which stream time `t_stream` arrived (audio comes in real time)."""
        return self._wall_at_t - (self._t_audio - t_stream)

    # ---- main loop --------------------------------------------------------------------------
    async def run(self) -> None:
        asr_task = asyncio.create_task(self._asr_loop(), name="asr")
        try:
            await self._send({"type": "state", "state": self.turns.state.value})
            while True:
                event = await self.transport.receive()
                if event is None:
                    break
                if isinstance(event, AudioIn):
                    await self._on_audio(event)
                elif isinstance(event, Played):
                    self._on_played(event)
                elif isinstance(event, ClientEvent):
                    self._on_client_event(event)
        finally:
            self._closed.set()
            for task in (self._reply_task, asr_task):
                if task is not None and not task.done():
                    task.cancel()
            for task in (self._reply_task, asr_task):
                if task is not None:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def _send(self, event: dict) -> None:
        with contextlib.suppress(Exception):  # a UI event must never kill the session
            await self.transport.send_event(event)

    async def _on_audio(self, ev: AudioIn) -> None:
        if self._resampler is None or self._resampler.in_rate != ev.sample_rate:
            self._resampler = StreamResampler(ev.sample_rate, ASR_RATE)
        x = self._resampler(ev.pcm)
        if x.size == 0:
            return
        self._t_audio += x.size / ASR_RATE
        self._wall_at_t = time.perf_counter()
        self._preroll.append(x)
        self._preroll_n += x.size
        while self._preroll_n - self._preroll[0].size >= self.config.turns.preroll_s * ASR_RATE:
            self._preroll_n -= self._preroll.popleft().size
        probs = await asyncio.to_thread(self._vad, x)
        t_first = self._t_audio - x.size / ASR_RATE
        commands = []
        for i, p in enumerate(probs):
            # frames complete at roughly the end of this chunk; spread them back over it
            t = max(t_first, self._t_audio - (len(probs) - 1 - i) * VAD_FRAME_S)
            commands += self.turns.on_vad(t, p, VAD_FRAME_S)
        if self._utterance_active:
            await self._asr_q.put(("audio", x))
        for cmd in commands:
            await self._on_command(cmd)

    async def _on_command(self, cmd) -> None:
        now = time.perf_counter()
        if isinstance(cmd, BargeIn):
            self.tracer.instant("turn", "barge_in", turn=len(self.records))
            await self._barge_in()
        elif isinstance(cmd, StartUtterance):
            self.tracer.instant("turn", "user_speech_start", turn=len(self.records))
            self._utterance_active = True
            await self._asr_q.put(("start", np.concatenate(list(self._preroll))))
            await self._send({"type": "state", "state": self.turns.state.value})
        elif isinstance(cmd, EndOfTurn):
            self._utterance_active = False
            rec = TurnRecord(index=len(self.records), speech_end=self.wall_of(cmd.t_speech_end), endpoint=now)
            self.records.append(rec)
            self.tracer.instant("turn", "user_speech_end", turn=rec.index, ts_ns=_ns(rec.speech_end))
            self.tracer.instant("turn", "endpoint", turn=rec.index, ts_ns=_ns(now))
            await self._asr_q.put(("final", rec))
            await self._send({"type": "endpoint", "turn": rec.index, "speech_end_ms": rec.speech_end * 1000,
                              "speech_end_stream_s": round(cmd.t_speech_end, 3)})
            await self._send({"type": "state", "state": self.turns.state.value})

    def _on_played(self, ev: Played) -> None:
        if self._playout is not None and ev.event == "start":
            self._playout.played_ids.add(ev.chunk_id)
        ts = _ns(ev.server_time) if ev.server_time is not None else None
        self.tracer.instant("client", "playout_start" if ev.event == "start" else "playout_end",
                            turn=len(self.records) - 1, ts_ns=ts, chunk=ev.chunk_id)

    def _on_client_event(self, ev: ClientEvent) -> None:
        if ev.kind == "metrics":
            turn, m2e = ev.data.get("turn"), ev.data.get("mouth_to_ear_ms")
            if isinstance(turn, int) and 0 <= turn < len(self.records) and isinstance(m2e, (int, float)):
                self.records[turn].mouth_to_ear_ms = round(float(m2e), 1)
                self.tracer.instant("client", "mouth_to_ear", turn=turn, ms=float(m2e))
            return
        self.tracer.instant("client", ev.kind, **{k: v for k, v in ev.data.items() if isinstance(v, (int, float, str))})

    # ---- recognizer -------------------------------------------------------------------------
    async def _asr_loop(self) -> None:
        last_partial = ""
        while True:
            op, arg = await self._asr_q.get()
            if op == "start":
                self._asr.reset()
                self._asr.push(arg)
                last_partial = ""
            elif op == "audio":
                try:
                    self._asr.push(arg)
                except OverflowError:
                    continue  # the turn machine ends the utterance before this; never grow
                if self._asr_q.empty():  # only decode partials when not behind
                    hyp = await asyncio.to_thread(self._traced, "asr", "partial_decode", self._asr.partial)
                    if hyp is not None and hyp.text and hyp.text != last_partial:
                        last_partial = hyp.text
                        self.tracer.instant("asr", "partial", turn=len(self.records), text=hyp.text)
                        await self._send({"type": "partial", "text": hyp.text, "stable": hyp.stable_text})
            elif op == "final":
                hyp: Hypothesis = await asyncio.to_thread(self._traced, "asr", "final_decode", self._asr.finalize)
                rec: TurnRecord = arg
                rec.asr_final = time.perf_counter()
                rec.user_text = hyp.text
                self.tracer.instant("asr", "final", turn=rec.index, text=hyp.text)
                await self._send({"type": "final", "turn": rec.index, "text": hyp.text,
                                  "words": [[w.text, round(w.start, 3), round(w.end, 3)] for w in hyp.words]})
                await self._start_reply(rec)

    def _traced(self, stage: str, name: str, fn):
        """Run a blocking model call (in a worker thread) inside a trace span."""
        turn = len(self.records) - 1 if self.turns.state == State.THINKING else len(self.records)
        with self.tracer.span(stage, name, turn=turn), profile_region(f"{stage}.{name}"):
            return fn()

    # ---- reply ------------------------------------------------------------------------------
    async def _start_reply(self, rec: TurnRecord) -> None:
        await self._cancel_reply()
        if not any(ch.isalnum() for ch in rec.user_text) or self.turns.state != State.THINKING:
            if self.turns.state == State.THINKING:
                self.turns.on_reply_finished(time.perf_counter())
                await self._send({"type": "state", "state": self.turns.state.value})
            return
        self._reply_task = asyncio.create_task(self._reply(rec), name=f"reply-{rec.index}")

    async def _cancel_reply(self) -> None:
        task, self._reply_task = self._reply_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _barge_in(self) -> None:
        playout, task = self._playout, self._reply_task
        await self._cancel_reply()
        await self.transport.clear()
        self.tracer.instant("transport", "clear", turn=len(self.records) - 1)
        if playout is not None and self.records and task is not None:
            rec = self.records[-1]
            rec.interrupted = True
            rec.reply_text = "".join(rec.tokens).strip()
            rec.heard_text = playout.heard_text(self.transport.reports_playout)
            self._remember(rec.user_text, rec.heard_text)
        self._playout = None
        await self._send({"type": "interrupted", "heard": self.records[-1].heard_text if self.records else ""})

    def _remember(self, user: str, assistant: str) -> None:
        self.history.append({"role": "user", "content": user})
        if assistant:
            self.history.append({"role": "assistant", "content": assistant})
        del self.history[:-self.config.max_history_messages]

    async def _reply(self, rec: TurnRecord) -> None:
        messages: list[Message] = [{"role": "system", "content": self.config.system_prompt},
                                   *self.history, {"role": "user", "content": rec.user_text}]
        playout = self._playout = Playout(self.transport, self.config.playout_lead_s, self.config.piece_s,
                                         lambda: next(self._chunk_ids))
        text_q: asyncio.Queue = asyncio.Queue(maxsize=self.config.text_queue)
        self.tracer.instant("llm", "request", turn=rec.index)
        tokens = rec.tokens
        waterfall = self.config.mode == "waterfall"

        held: list[str] = []  # waterfall: the whole answer is kept until the LLM is done

        async def emit(piece: str) -> None:
            if waterfall:
                held.append(piece)
            else:
                await text_q.put(piece)

        async def think() -> None:
            chunker = TextChunker()
            span = self.tracer.begin("llm", "generate", turn=rec.index, model=getattr(self.models.llm, "name", "llm"))
            try:
                await generate(chunker)
            except asyncio.CancelledError:
                self.tracer.instant("llm", "cancel", turn=rec.index)
                raise
            finally:
                self.tracer.end(span, tokens=len(tokens))
            for piece in chunker.flush():
                await emit(piece)
            self.tracer.instant("llm", "done", turn=rec.index)
            if not waterfall:
                await text_q.put(None)

        async def generate(chunker: TextChunker) -> None:
            async with contextlib.aclosing(self.models.llm.stream(messages, self.config.max_tokens)) as toks:
                async for tok in toks:
                    if not tokens:
                        rec.llm_first_token = time.perf_counter()
                        self.tracer.instant("llm", "first_token", turn=rec.index)
                    tokens.append(tok)
                    self.tracer.instant("llm", "token", turn=rec.index, text=tok)
                    await self._send({"type": "bot_text", "turn": rec.index, "text": tok})
                    for piece in chunker.push(tok):
                        await emit(piece)

        async def texts() -> AsyncIterator[str]:
            if waterfall:
                source = iter(held)
                get = lambda: _next_async(source)  # noqa: E731
            else:
                get = text_q.get
            while (piece := await get()) is not None:
                self.tracer.instant("tts", "request", turn=rec.index, text=piece)
                yield piece

        async def speak() -> None:
            try:
                await synthesize()
            except asyncio.CancelledError:
                self.tracer.instant("tts", "cancel", turn=rec.index)
                raise
            self.tracer.instant("tts", "done", turn=rec.index)

        async def synthesize() -> None:
            audio: list[AudioChunk] = []
            async with contextlib.aclosing(self.models.tts.stream(texts())) as chunks:
                async for chunk in chunks:
                    if not rec.tts_first_chunk:
                        rec.tts_first_chunk = time.perf_counter()
                        self.tracer.instant("tts", "first_chunk", turn=rec.index)
                    self.tracer.instant("tts", "chunk", turn=rec.index, samples=int(chunk.pcm.size),
                                        sample_rate=chunk.sample_rate, text=chunk.text)
                    if waterfall:
                        audio.append(chunk)  # all speech first, then play
                    else:
                        await self._play(rec, playout, chunk)
            for chunk in audio:
                await self._play(rec, playout, chunk)

        if waterfall:
            await think()
            await speak()
        else:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(think())
                tg.create_task(speak())
        rec.reply_text = "".join(tokens).strip()
        await playout.wait_played()
        rec.heard_text = rec.reply_text
        self._remember(rec.user_text, rec.reply_text)
        self._playout = None
        self.tracer.instant("turn", "turn_end", turn=rec.index)
        self.turns.on_reply_finished(time.perf_counter())
        await self._send({"type": "bot_done", "turn": rec.index, "text": rec.reply_text})
        await self._send({"type": "latency", **rec.summary()})
        await self._send({"type": "state", "state": self.turns.state.value})

    async def _play(self, rec: TurnRecord, playout: Playout, chunk: AudioChunk) -> None:
        if not rec.first_audio_out:
            rec.first_audio_out = time.perf_counter()
            self.turns.on_reply_started(rec.first_audio_out)
            self.tracer.instant("transport", "send_audio", turn=rec.index)
            await self._send({"type": "state", "state": self.turns.state.value})
        await playout.play(chunk)


async def _next_async(it):
    return next(it, None)


def _ns(t_seconds: float) -> int:
    """perf_counter seconds -> the tracer's perf_counter_ns clock."""
    return int(t_seconds * 1e9)
