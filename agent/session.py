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

from agent.eou import as_of_pause
from agent.profiling import profile_region
from agent.trace import NullTracer, Tracer
from agent.speculation import Branch, SpeculationStats, same_transcript
from agent.turns import (
    BargeIn, EndOfTurn, ResumeReply, SpeechPaused, SpeechResumed, SpeechStopped, StartUtterance, State, TurnConfig, TurnMachine)
from asr.base import Hypothesis, StreamingRecognizer
from llm.base import ChatModel, Message
from transport.audio import StreamResampler
from transport.base import AudioIn, AudioOut, ClientEvent, Played, Transport
from tts.base import AudioChunk, Synthesizer
from tts.chunking import TextChunker, ends_sentence

log = logging.getLogger("duplex.session")
ASR_RATE = 16000
VAD_FRAME = 512  # samples per VAD window, aligned with the stream's start
VAD_FRAME_S = VAD_FRAME / ASR_RATE

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Reply in one or two short, plain English sentences.")


@dataclass
class SessionConfig:
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    mode: str = "concurrent"  # "concurrent" | "waterfall"
    turns: TurnConfig = field(default_factory=TurnConfig)
    # context kept for the LLM; when it overflows, it is cut back to half in one go, so the LLM's
    # cached prompt prefix stays valid for several turns instead of shifting every turn
    max_history_messages: int = 16
    max_tokens: int = 80
    # words of the answer's first TTS chunk (see tts/chunking.py): each word waited for costs
    # one LLM token (~17 ms on this CPU) before the first audio
    first_chunk_words: int = 2
    playout_lead_s: float = 0.4  # audio sent ahead of real time; bounds the far end's buffer
    piece_s: float = 0.1  # size of each audio message
    text_queue: int = 8  # LLM -> TTS chunks in flight
    asr_queue: int = 1024  # audio chunks waiting for the recognizer (~20 s of 20 ms frames)
    speculate: bool = True  # start ASR final + LLM + TTS at a pause, before the turn is confirmed
    # spoken when the far end's audio first arrives (a phone line or the page's microphone is
    # live), as LiveKit's `say` / pipecat's first-message examples do; the context keeps it as
    # the assistant's first message (what was heard of it, if the user talks over it)
    greeting: str | None = None
    # early decodes run (and speculated on) per user turn; pauses inside a sentence use some
    max_speculations_per_turn: int = 5
    # audio after the end of speech given to the final decode; at most the turn machine's
    # decode_after_s plus one VAD frame, so the early decode and the final see the same audio
    final_pad_s: float = 0.12


@dataclass
class Models:
    asr: StreamingRecognizer
    llm: ChatModel
    tts: Synthesizer
    vad_factory: Callable[[], object]  # -> a callable scoring 16 kHz audio into 32 ms frame probs
    eou: object | None = None  # end-of-turn model: .probability(float32 16 kHz audio) -> float


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
    speculative: bool = False  # the reply was started before the turn ended, and committed
    tts_samples: float = 0.0  # seconds of speech synthesized
    tokens: list[str] = field(default_factory=list, repr=False)

    @property
    def voice_to_voice(self) -> float | None:
        # None without both ends: a reply not yet heard, or a greeting (no user speech before it)
        return self.first_audio_out - self.speech_end if self.first_audio_out and self.speech_end else None

    def summary(self) -> dict:
        """Per-stage waits as consecutive differences of milestones. A speculative reply can
        reach a milestone before the one ahead of it (LLM before endpoint): each milestone is
        clamped to the previous one, so the stages always add up to voice-to-voice."""
        names = ["endpoint_ms", "asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms", "send_ms"]
        marks = [self.speech_end, self.endpoint, self.asr_final, self.llm_first_token,
                 self.tts_first_chunk, self.first_audio_out]
        stages: dict[str, float | None] = {}
        prev = marks[0]
        for name, m in zip(names, marks[1:]):
            if not (m and prev):
                stages[name] = None
                continue
            m = max(m, prev)
            stages[name] = round((m - prev) * 1000, 1)
            prev = m
        v2v = self.voice_to_voice
        return {
            "turn": self.index, "user": self.user_text, "reply": self.reply_text,
            "heard": self.heard_text, "interrupted": self.interrupted, "speculative": self.speculative,
            **stages,
            "voice_to_voice_ms": round(v2v * 1000, 1) if v2v is not None else None,
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
        self.clauses: list[tuple[int, str]] = []  # (first chunk_id, text) of each TTS chunk

    async def play(self, chunk: AudioChunk) -> None:
        first = True
        for pcm, text in split_chunk(chunk, self.piece_s):
            if self.t0 is None:
                self.t0 = time.perf_counter()
            ahead = self.sent_s - (time.perf_counter() - self.t0)
            if ahead > self.lead_s:
                await asyncio.sleep(ahead - self.lead_s)
            cid = self._new_id()
            if first:
                self.clauses.append((cid, chunk.text))
                first = False
            self.pieces.append((cid, self.sent_s, text))
            await self.transport.send_audio(AudioOut(pcm, chunk.sample_rate, cid, text))
            self.sent_s += pcm.size / chunk.sample_rate

    async def wait_played(self) -> None:
        if self.t0 is not None:
            remaining = self.t0 + self.sent_s - time.perf_counter()
            if remaining > 0:
                await asyncio.sleep(remaining)

    def _played(self, use_marks: bool) -> set[int]:
        if use_marks:
            return self.played_ids
        elapsed = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        return {cid for cid, off, _ in self.pieces if off <= elapsed}

    def heard_text(self, use_marks: bool) -> str:
        """Text of the pieces the far end started playing (its marks), else those whose time came."""
        played = self._played(use_marks)
        return " ".join(t for cid, _, t in self.pieces if cid in played and t).strip()

    def heard_before_clause(self, k: int, use_marks: bool) -> str:
        """Heard text of the clauses before clause `k`."""
        played = self._played(use_marks)
        limit = self.clauses[k][0] if k < len(self.clauses) else 1 << 62
        return " ".join(t for cid, _, t in self.pieces if cid < limit and cid in played and t).strip()

    def interrupted_clause(self, use_marks: bool) -> int:
        """Index of the TTS chunk (clause) that was playing, or next to play, when cut off."""
        played = self._played(use_marks)
        started = [i for i, (cid, _) in enumerate(self.clauses) if cid in played]
        return started[-1] if started else 0


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
        self.records = TurnLog()
        self.spec = SpeculationStats()
        self._vad = models.vad_factory()
        self._asr = models.asr.open_stream()
        self._resampler: StreamResampler | None = None
        self._t_audio = 0.0  # stream time: seconds of 16 kHz audio received
        self._wall_at_t = time.perf_counter()
        self._recent = AudioRing(int(8 * ASR_RATE))  # the end-of-turn model looks at <= 8 s
        self._utterance_active = False
        self._utt_t0 = 0.0  # stream time of the first sample in the recognizer's buffer
        self._asr_q: asyncio.Queue = asyncio.Queue(maxsize=self.config.asr_queue)
        # ops raised by the recognizer loop itself (it must never wait on its own full queue);
        # at most a few per turn
        self._asr_own_ops: deque = deque(maxlen=16)
        self._asr_task: asyncio.Task | None = None
        self._reply_task: asyncio.Task | None = None
        self._reply_rec: TurnRecord | None = None
        self._playout: Playout | None = None
        self._ended = False  # run() is ending: warm no more prompts (their work would be wasted)
        self._branch: Branch | None = None
        self._pause_decodes = 0
        self._decoded: tuple[float, Hypothesis] | None = None  # last early decode: (speech end, text)
        self._early_n: tuple[float, int] | None = None  # last early decode: (speech end, samples)
        self._asr_samples = 0  # samples of this utterance sent to the recognizer
        self._eou_task: asyncio.Task | None = None
        self._eou_asked: float | None = None  # the silence (speech end) last asked about
        self._warm_task: asyncio.Task | None = None
        # (turn, heard, heard before the cut clause, text from the cut clause on)
        self._resumable: tuple[TurnRecord, str, str, str] | None = None
        self._chunk_ids = itertools.count()
        self._greeting_due = bool(self.config.greeting)

    @property
    def speculation_stats(self) -> dict:
        return self.spec.as_dict()

    # ---- clocks ---------------------------------------------------------------------------
    def wall_of(self, t_stream: float) -> float:
        """perf_counter time at which stream time `t_stream` arrived (audio comes in real time)."""
        return self._wall_at_t - (self._t_audio - t_stream)

    # ---- main loop --------------------------------------------------------------------------
    async def run(self) -> None:
        asr_task = self._asr_task = asyncio.create_task(self._asr_loop(), name="asr")
        self._warm_prompt_cache()  # the system prompt, before the first turn needs it
        try:
            await self._send_state()
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
            self._ended = True
            await self._cancel_branch("session ended")
            await self._end_reply_with_session()
            tasks = [t for t in (self._reply_task, self._eou_task, self._warm_task, asr_task) if t is not None]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _send(self, event: dict) -> None:
        with contextlib.suppress(Exception):  # a UI event must never kill the session
            await self.transport.send_event(event)

    async def _send_state(self) -> None:
        await self._send({"type": "state", "state": self.turns.state.value})

    def _greet(self) -> None:
        """Speak the greeting as a reply of its own: a turn with no user words."""
        self._greeting_due = False
        rec = TurnRecord(index=len(self.records), endpoint=time.perf_counter())
        if not self.turns.on_bot_initiated(rec.endpoint):
            return  # the user spoke first
        self.records.append(rec)
        self.tracer.instant("turn", "greeting", turn=rec.index, text=self.config.greeting)
        self._reply_rec = rec
        self._reply_task = asyncio.create_task(self._reply(rec, "", fixed_text=self.config.greeting),
                                               name="greeting")

    async def _on_audio(self, ev: AudioIn) -> None:
        if self._greeting_due:
            self._greet()
        if self._resampler is None or self._resampler.in_rate != ev.sample_rate:
            self._resampler = StreamResampler(ev.sample_rate, ASR_RATE)
        x = self._resampler(ev.pcm)
        if x.size == 0:
            return
        self._t_audio += x.size / ASR_RATE
        self._wall_at_t = time.perf_counter()
        self._recent.push(x)
        probs = await asyncio.to_thread(self._vad, x)
        levels = self._recent.window_levels(len(probs), VAD_FRAME)
        t_first = self._t_audio - x.size / ASR_RATE
        commands = []
        for i, p in enumerate(probs):
            # frames complete at roughly the end of this chunk; spread them back over it
            t = max(t_first, self._t_audio - (len(probs) - 1 - i) * VAD_FRAME_S)
            commands += self.turns.on_vad(t, p, VAD_FRAME_S, levels[i] if i < len(levels) else None)
        if self._utterance_active:
            await self._asr_q.put(("audio", x))
            self._asr_samples += x.size
        await self._run_commands(commands)

    async def _asr_put(self, op: tuple) -> None:
        if asyncio.current_task() is self._asr_task:
            self._asr_own_ops.append(op)
        else:
            await self._asr_q.put(op)

    async def _run_commands(self, commands) -> None:
        for cmd in commands:
            await self._on_command(cmd)

    async def _on_command(self, cmd) -> None:
        now = time.perf_counter()
        turn = len(self.records)
        if isinstance(cmd, BargeIn):
            self.tracer.instant("turn", "barge_in", turn=turn - 1)
            await self._barge_in()
        elif isinstance(cmd, StartUtterance):
            self.tracer.instant("turn", "user_speech_start", turn=turn)
            self._utterance_active = True
            self._pause_decodes = 0
            self._decoded = self._early_n = None
            speech_so_far = int((self._t_audio - cmd.t_start) * ASR_RATE)
            preroll = self._recent.last(int(self.config.turns.preroll_s * ASR_RATE) + speech_so_far)
            self._utt_t0 = self._t_audio - preroll.size / ASR_RATE
            self._asr_samples = preroll.size
            await self._asr_put(("start", (preroll, self._utt_t0)))
            await self._send_state()
        elif isinstance(cmd, SpeechStopped):
            # decode as soon as the user stops, in both modes (a streaming recognizer would have
            # this text anyway); the final decode over the same audio reuses it. The audio is what
            # the recognizer has by now; the final decode asks for the same samples.
            n = min(self._samples_until(cmd.t_speech_end), self._asr_samples)
            self._early_n = (cmd.t_speech_end, n)
            await self._asr_put(("pause_decode", (cmd.t_speech_end, n)))
        elif isinstance(cmd, SpeechPaused):
            self.tracer.instant("turn", "pause", turn=turn)
            self._start_eou_check(cmd.t_speech_end)  # unless asked already in this silence
            await self._send_state()
            if self._decoded is not None and self._decoded[0] == cmd.t_speech_end:
                await self._on_pause_transcript(self._decoded[1])  # decoded before the pause
        elif isinstance(cmd, SpeechResumed):
            self.tracer.instant("turn", "speech_resumed", turn=turn)
            await self._cancel_branch("user went on speaking")
            await self._send_state()
        elif isinstance(cmd, EndOfTurn):
            self._utterance_active = False
            rec = TurnRecord(index=turn, speech_end=self.wall_of(cmd.t_speech_end), endpoint=now)
            self.records.append(rec)
            self.tracer.instant("turn", "user_speech_end", turn=rec.index, ts_ns=_ns(rec.speech_end))
            self.tracer.instant("turn", "endpoint", turn=rec.index, ts_ns=_ns(now))
            await self._asr_put(("final", (rec, cmd.t_speech_end)))
            await self._send({"type": "endpoint", "turn": rec.index, "speech_end_ms": rec.speech_end * 1000,
                              "speech_end_stream_s": round(cmd.t_speech_end, 3)})
            await self._send_state()
        elif isinstance(cmd, ResumeReply):
            self._utterance_active = False
            await self._asr_put(("abort", None))
            await self._resume()
            await self._send_state()

    def _start_eou_check(self, t_speech_end: float) -> asyncio.Task | None:
        """Ask the end-of-turn model about the utterance up to this silence (once per silence).
        Returns the check's task, or None when none was started."""
        eou = self.models.eou
        if eou is None or not self.config.turns.use_eou or self._eou_asked == t_speech_end:
            return None
        if self._eou_task is not None and not self._eou_task.done():
            return None
        self._eou_asked = t_speech_end
        # the verdict counts once the pause is confirmed: ask about the audio as it will be then
        # (the pause is Silero's silence; a quiet frame before it is still part of the audio).
        # Up to the last VAD frame, so that the silence after the speech is the same whatever
        # the transport's chunking (smart-turn's verdict can flip with 32 ms more of it).
        audio = as_of_pause(self._recent.last_whole(self._recent.capacity, VAD_FRAME), self.turns.vad_silence_s,
                            self.config.turns.pause_s)

        async def check() -> None:
            t0 = time.perf_counter()
            p = await asyncio.to_thread(eou.probability, audio)
            self.tracer.complete("turn", "eou_check", ts_ns=_ns(t0), dur_ns=_ns(time.perf_counter() - t0),
                                 turn=len(self.records), probability=round(p, 3))
            await self._run_commands(self.turns.on_eou(self._t_audio, p, t_speech_end))

        self._eou_task = asyncio.create_task(check(), name="eou")
        return self._eou_task

    def _on_played(self, ev: Played) -> None:
        if self._playout is not None and ev.event == "start":
            self._playout.played_ids.add(ev.chunk_id)
        ts = _ns(ev.server_time) if ev.server_time is not None else None
        self.tracer.instant("client", "playout_start" if ev.event == "start" else "playout_end",
                            turn=len(self.records) - 1, ts_ns=ts, chunk=ev.chunk_id)

    def _on_client_event(self, ev: ClientEvent) -> None:
        if ev.kind == "metrics":
            turn, m2e = ev.data.get("turn"), ev.data.get("mouth_to_ear_ms")
            if isinstance(turn, int) and turn in self.records and isinstance(m2e, (int, float)):
                self.records[turn].mouth_to_ear_ms = round(float(m2e), 1)
                self.tracer.instant("client", "mouth_to_ear", turn=turn, ms=float(m2e))
            return
        self.tracer.instant("client", ev.kind, **{k: v for k, v in ev.data.items() if isinstance(v, (int, float, str))})

    # ---- recognizer -------------------------------------------------------------------------
    def _samples_until(self, t_speech_end: float) -> int:
        return int((t_speech_end + self.config.final_pad_s - self._utt_t0) * ASR_RATE)

    async def _asr_loop(self) -> None:
        last_partial = ""
        while True:
            op, arg = self._asr_own_ops.popleft() if self._asr_own_ops else await self._asr_q.get()
            if op == "start":
                audio, t0 = arg
                self._asr.reset(t0)
                self._asr.push(audio)
                last_partial = ""
            elif op == "abort":
                self._asr.reset()
            elif op == "audio":
                try:
                    self._asr.push(arg)
                except OverflowError:
                    continue  # the turn machine ends the utterance before this; never grow
                # partials only while the user speaks and the recognizer is not behind
                if self._asr_q.empty() and self.turns.in_speech:
                    # abandoned when the user stops meanwhile: the decode of their last words
                    # must not wait for it
                    hyp = await asyncio.to_thread(self._traced, "asr", "partial_decode",
                                                  lambda: self._asr.partial(keep_going=lambda: self.turns.in_speech))
                    if hyp is not None and hyp.text and hyp.text != last_partial:
                        last_partial = hyp.text
                        self.tracer.instant("asr", "partial", turn=len(self.records), text=hyp.text)
                        await self._send({"type": "partial", "text": hyp.text, "stable": hyp.stable_text})
                        await self._run_commands(self.turns.on_words(self._t_audio, len(hyp.text.split())))
                        # the LLM reads the words so far while the user goes on; not once they
                        # stopped (the decode of their last words needs the CPU then), nor while
                        # a reply is on (a barge-in: its history is not settled yet), nor in
                        # waterfall mode (its LLM sees nothing before the final transcript)
                        if (self.turns.in_speech and self.turns.state == State.USER_SPEAKING
                                and self._reply_task is None and self._branch is None
                                and self.config.mode == "concurrent"):
                            self._warm_prompt_cache(hyp.text)
            elif op == "pause_decode":
                t_end, n = arg
                # skip it when the user is speaking again or a later silence superseded this one
                # (their next silence asks anew), or when this turn's decodes are spent
                if (not self._still_silent_since(t_end)
                        or self._pause_decodes >= self.config.max_speculations_per_turn):
                    continue
                self._pause_decodes += 1
                # the turn model first, alone (~35 ms): beside the decode or the LLM's prompt it
                # would take the cores they need (the prompt took ~60 ms longer). Its verdict
                # waits in the turn machine for the pause.
                eou = self._start_eou_check(t_end)
                if eou is not None:
                    await asyncio.wait([eou])
                    if not self._still_silent_since(t_end):
                        continue  # the user went on meanwhile: their next silence decodes
                hyp = await asyncio.to_thread(self._traced, "asr", "pause_decode", lambda: self._asr.decode(n))
                self._decoded = (t_end, hyp)
                if self._still_silent_since(t_end):
                    # still silent: speculate on the transcript, before the pause too
                    self._start_eou_check(t_end)  # if the model was busy with an earlier silence
                    await self._on_pause_transcript(hyp)
            elif op == "final":
                rec, t_end = arg
                early = self._early_n
                n = early[1] if early is not None and early[0] == t_end else self._samples_until(t_end)
                hyp: Hypothesis = await asyncio.to_thread(self._traced, "asr", "final_decode",
                                                          lambda: self._asr.finalize(n), rec.index)
                rec.asr_final = time.perf_counter()
                rec.user_text = hyp.text
                self.tracer.instant("asr", "final", turn=rec.index, text=hyp.text)
                await self._send({"type": "final", "turn": rec.index, "text": hyp.text,
                                  "words": [[w.text, round(w.start, 3), round(w.end, 3)] for w in hyp.words]})
                await self._on_final(rec)

    def _still_silent_since(self, t_speech_end: float) -> bool:
        """The user has said nothing since the silence that began at `t_speech_end` (the one the
        last early decode was asked for)."""
        return (not self.turns.in_speech and self._early_n is not None
                and self._early_n[0] == t_speech_end)

    async def _on_pause_transcript(self, hyp: Hypothesis) -> None:
        """The transcript up to the current silence: speculate on it (concurrent mode) and let
        the turn machine judge whether it ends a sentence. Only while the user is still silent
        and the turn not yet taken; before the pause too (`SpeechResumed` cancels the branch if
        the user goes on)."""
        if (self.turns.in_speech or self.turns.state not in (State.USER_SPEAKING, State.ENDPOINT_PENDING)
                or not _has_words(hyp.text)):
            return
        if self.config.speculate and self.config.mode == "concurrent" and self._branch is None:
            self._start_branch(hyp.text)
        await self._run_commands(self.turns.on_transcript(self._t_audio, ends_sentence(hyp.text)))

    def _traced(self, stage: str, name: str, fn, turn: int | None = None):
        """Run a blocking model call (in a worker thread) inside a trace span. The turn defaults
        to the one being spoken (the next record)."""
        turn = len(self.records) if turn is None else turn
        with self.tracer.span(stage, name, turn=turn), profile_region(f"{stage}.{name}"):
            return fn()

    # ---- turns end: commit, restart or resume ------------------------------------------------
    async def _on_final(self, rec: TurnRecord) -> None:
        n_words = len(rec.user_text.split()) if _has_words(rec.user_text) else 0
        commands = self.turns.on_final(time.perf_counter(), n_words)
        if not n_words:
            await self._cancel_branch("empty transcript")
            await self._run_commands(commands)  # maybe ResumeReply
            await self._send_state()
            return
        self._resumable = None  # the user really spoke: the interrupted reply is gone
        branch = self._branch
        # a branch whose task already ended has failed (a live one waits at its gate)
        if branch is not None and same_transcript(branch.transcript, rec.user_text) and not branch.task.done():
            self._branch = None
            self.spec.committed += 1
            self.tracer.instant("speculation", "commit", turn=rec.index, flow=rec.index + 1)
            branch.record.index = rec.index
            for name in ("speech_end", "endpoint", "asr_final", "user_text"):
                setattr(branch.record, name, getattr(rec, name))
            branch.record.speculative = True
            self.records[rec.index] = branch.record
            self._reply_task, self._reply_rec = branch.task, branch.record
            branch.gate.set()
            return
        await self._cancel_branch("transcript changed" if branch else "")
        if self.turns.state == State.THINKING:
            await self._start_reply(rec)

    def _start_branch(self, transcript: str) -> None:
        rec = TurnRecord(index=len(self.records), user_text=transcript)
        gate = asyncio.Event()
        task = asyncio.create_task(self._reply(rec, transcript, gate=gate), name=f"reply-spec-{rec.index}")
        self._branch = Branch(transcript, task, gate, rec)
        self.spec.started += 1
        self.tracer.instant("speculation", "start", turn=rec.index, text=transcript, flow=rec.index + 1)

    async def _cancel_branch(self, why: str) -> None:
        branch, self._branch = self._branch, None
        if branch is None:
            return
        self.spec.cancelled += 1
        self.tracer.instant("speculation", "cancel", turn=branch.record.index, reason=why)
        await _cancel(branch.task)
        self.spec.wasted_tokens += len(branch.record.tokens)
        self.spec.wasted_tts_s += branch.tts_seconds()

    async def _start_reply(self, rec: TurnRecord) -> None:
        await self._cancel_reply()
        self._reply_rec = rec
        self._reply_task = asyncio.create_task(self._reply(rec, rec.user_text), name=f"reply-{rec.index}")

    async def _cancel_reply(self) -> None:
        task, self._reply_task = self._reply_task, None
        await _cancel(task)

    async def _barge_in(self) -> None:
        playout, rec, task = self._playout, self._reply_rec, self._reply_task
        await self._cancel_branch("barge-in")
        await self._cancel_reply()
        await self.transport.clear()
        self.tracer.instant("transport", "clear", turn=len(self.records) - 1)
        self._playout = None
        if rec is not None and task is not None:
            heard = self._keep_cut_reply(rec, playout, "barge-in")
            if playout is not None and playout.clauses:
                k = playout.interrupted_clause(self.transport.reports_playout)
                start = rec.reply_text.find(playout.clauses[k][1])
                rest = rec.reply_text[start:] if start >= 0 else " ".join(t for _, t in playout.clauses[k:])
                self._resumable = (rec, heard, playout.heard_before_clause(k, self.transport.reports_playout), rest)
        await self._send({"type": "interrupted", "heard": rec.heard_text if rec else ""})

    async def _resume(self) -> None:
        """False interruption: speak the interrupted reply again from the clause that was cut."""
        if self._resumable is None:
            self.turns.on_reply_finished(time.perf_counter())
            return
        rec, heard, prefix, rest = self._resumable
        self._resumable = None
        self.tracer.instant("turn", "resume", turn=rec.index, text=rest)
        # forget the truncated exchange stored at the barge-in; the resumed reply stores it whole
        if self.history[-1:] == [{"role": "assistant", "content": heard}]:
            self.history.pop()
        if self.history[-1:] == [{"role": "user", "content": rec.user_text}]:
            self.history.pop()
        resumed = TurnRecord(index=rec.index, user_text=rec.user_text)
        self._reply_rec = resumed
        self._reply_task = asyncio.create_task(
            self._reply(resumed, rec.user_text, fixed_text=rest, spoken_prefix=prefix),
            name=f"reply-resume-{rec.index}")

    def _keep_cut_reply(self, rec: TurnRecord, playout: Playout | None, why: str) -> str:
        """The reply of `rec` stopped before its end (its task is cancelled): keep what was
        generated and what the far end heard of it in the turn's record and in the context."""
        rec.interrupted = True
        rec.reply_text = "".join(rec.tokens).strip()
        heard = playout.heard_text(self.transport.reports_playout) if playout else ""
        rec.heard_text = heard
        self.tracer.instant("turn", "interrupted", turn=rec.index, heard=heard, why=why)
        self._remember(rec.user_text, heard)
        return heard

    async def _end_reply_with_session(self) -> None:
        """The far end hung up (or the input ended) while a reply was on its way: the turn keeps
        the user's words and what was heard of the reply, as after a barge-in."""
        rec, task, playout = self._reply_rec, self._reply_task, self._playout
        if rec is None or task is None or task.done():
            return
        await self._cancel_reply()
        self._keep_cut_reply(rec, playout, "session ended")

    def _remember(self, user: str, assistant: str) -> None:
        if user:  # a greeting has no user message before it
            self.history.append({"role": "user", "content": user})
        if assistant:
            self.history.append({"role": "assistant", "content": assistant})
        if len(self.history) > self.config.max_history_messages:
            keep = self.config.max_history_messages // 2
            del self.history[:len(self.history) - keep]
            if self.history and self.history[0]["role"] == "assistant":
                del self.history[0]  # never start the context with an answer
        # the next prompt starts with this history and the user's header: evaluate them now,
        # while nobody waits (after a history cut that is the whole prompt)
        self._warm_prompt_cache("")

    def _warm_prompt_cache(self, user_so_far: str | None = None) -> None:
        """Have the LLM evaluate a prompt prefix now, while the user speaks, instead of in the
        next turn's time to first token: a new prefix (the session's start, or the history just
        cut), or the user's words so far (`user_so_far`, a partial transcript; the final prompt
        shares every token up to the words that changed)."""
        warm = getattr(self.models.llm, "warm", None)
        if warm is None or self._ended or (self._warm_task is not None and not self._warm_task.done()):
            return
        messages: list[Message] = [{"role": "system", "content": self.config.system_prompt}, *self.history]
        if user_so_far is not None:
            messages.append({"role": "user", "content": user_so_far})

        async def run() -> None:
            with self.tracer.span("llm", "warm_cache", turn=len(self.records), messages=len(messages),
                                  user_words=len((user_so_far or "").split())):
                await asyncio.to_thread(warm, messages)

        self._warm_task = asyncio.create_task(run(), name="llm-warm")

    # ---- reply ------------------------------------------------------------------------------
    async def _reply(self, rec: TurnRecord, user_text: str, gate: asyncio.Event | None = None,
                     fixed_text: str | None = None, spoken_prefix: str = "") -> None:
        """LLM -> TTS -> playout for one answer. With `gate`, audio is held until the gate opens
        (speculation). With `fixed_text`, that text is spoken instead of asking the LLM.
        A model that fails (an LLM server gone, a voice that raises) ends the reply with an
        `error` event; the session goes on listening."""
        try:
            await self._reply_stages(rec, user_text, gate, fixed_text, spoken_prefix)
        except Exception as e:  # noqa: BLE001 - reported to the client, the session survives
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                e = e.exceptions[0]  # the TaskGroup's one failing stage
            log.warning("turn %d: reply failed: %s", rec.index, e)
            self.tracer.instant("turn", "reply_error", turn=rec.index, error=str(e)[:200])
            if gate is not None and not gate.is_set():
                return  # an uncommitted speculation: the turn's end starts a fresh reply
            rec.reply_text = "".join(rec.tokens).strip()
            self._reply_ended()
            await self._send({"type": "error", "code": "reply_failed", "message": str(e)})
            await self._send_state()

    async def _reply_stages(self, rec: TurnRecord, user_text: str, gate: asyncio.Event | None,
                            fixed_text: str | None, spoken_prefix: str) -> None:
        messages: list[Message] = [{"role": "system", "content": self.config.system_prompt},
                                   *self.history, {"role": "user", "content": user_text}]
        playout = Playout(self.transport, self.config.playout_lead_s, self.config.piece_s,
                          lambda: next(self._chunk_ids))
        text_q: asyncio.Queue = asyncio.Queue(maxsize=self.config.text_queue)
        self.tracer.instant("llm", "request", turn=rec.index, flow=rec.index + 1)
        tokens = rec.tokens
        waterfall = self.config.mode == "waterfall"
        held: list[str] = []  # waterfall: the whole answer is kept until the LLM is done
        # First audio first: once the first piece of text is out, the LLM waits until the voice
        # has turned it into audio. On a CPU the two would share the cores and both run at half
        # speed (Piper: ~38 ms alone, 60-95 ms beside the LLM) while the first chunk is the only
        # thing the user waits for; later tokens have the first chunk's playout to arrive in.
        first_piece_done = asyncio.Event()

        async def emit(piece: str) -> None:
            if waterfall:
                held.append(piece)
            else:
                await text_q.put(piece)
                await first_piece_done.wait()

        async def token_source() -> AsyncIterator[str]:
            if fixed_text is not None:
                for word in fixed_text.split(" "):
                    yield word + " "
                return
            async with contextlib.aclosing(self.models.llm.stream(messages, self.config.max_tokens)) as toks:
                async for tok in toks:
                    yield tok

        async def think() -> None:
            chunker = TextChunker(first_max_words=self.config.first_chunk_words)
            span = self.tracer.begin("llm", "generate", turn=rec.index, model=getattr(self.models.llm, "name", "llm"))
            try:
                async with contextlib.aclosing(token_source()) as toks:
                    async for tok in toks:
                        if not tokens:
                            rec.llm_first_token = time.perf_counter()
                            self.tracer.instant("llm", "first_token", turn=rec.index)
                        tokens.append(tok)
                        self.tracer.instant("llm", "token", turn=rec.index, text=tok)
                        if gate is None or gate.is_set():
                            await self._send({"type": "bot_text", "turn": rec.index, "text": tok})
                        for piece in chunker.push(tok):
                            await emit(piece)
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

        async def texts() -> AsyncIterator[str]:
            if waterfall:
                source = iter(held)
                get = lambda: _next_async(source)  # noqa: E731
            else:
                get = text_q.get
            while (piece := await get()) is not None:
                self.tracer.instant("tts", "request", turn=rec.index, text=piece, flow=rec.index + 1)
                yield piece
                first_piece_done.set()  # back for more: that piece is done (spoken, or had no words)

        async def speak() -> None:
            audio: list[AudioChunk] = []
            try:
                async with contextlib.aclosing(self.models.tts.stream(texts())) as chunks:
                    async for chunk in chunks:
                        if not rec.tts_first_chunk:
                            rec.tts_first_chunk = time.perf_counter()
                            first_piece_done.set()
                            self.tracer.instant("tts", "first_chunk", turn=rec.index)
                        rec.tts_samples += chunk.pcm.size / chunk.sample_rate
                        self.tracer.instant("tts", "chunk", turn=rec.index, samples=int(chunk.pcm.size),
                                            sample_rate=chunk.sample_rate, text=chunk.text)
                        if waterfall:
                            audio.append(chunk)  # all speech first, then play
                        else:
                            await self._play(rec, playout, chunk, gate)
            except asyncio.CancelledError:
                self.tracer.instant("tts", "cancel", turn=rec.index)
                raise
            finally:
                first_piece_done.set()
            self.tracer.instant("tts", "done", turn=rec.index)
            for chunk in audio:
                await self._play(rec, playout, chunk, gate)

        if waterfall:
            await think()
            await speak()
        else:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(think())
                tg.create_task(speak())
        if gate is not None:
            await gate.wait()  # a speculative reply with no audio still waits to be committed
        rec.reply_text = "".join(tokens).strip()
        await playout.wait_played()
        spoken = (spoken_prefix + " " + rec.reply_text).strip()  # a resumed reply follows what was heard
        rec.heard_text = spoken
        self._remember(rec.user_text, spoken)
        self.tracer.instant("turn", "turn_end", turn=rec.index)
        self._reply_ended()
        await self._send({"type": "bot_done", "turn": rec.index, "text": rec.reply_text})
        await self._send({"type": "latency", **rec.summary()})
        await self._send_state()

    def _reply_ended(self) -> None:
        """The reply in progress is over (played out, or failed): nothing plays, listen again."""
        self._playout = None
        self._reply_task = None
        self._reply_rec = None
        self.turns.on_reply_finished(time.perf_counter())

    async def _play(self, rec: TurnRecord, playout: Playout, chunk: AudioChunk, gate: asyncio.Event | None) -> None:
        if gate is not None and not gate.is_set():
            await gate.wait()  # speculation: synthesized, but held until the turn is confirmed
            await self._send({"type": "bot_text", "turn": rec.index, "text": "".join(rec.tokens)})
        if not rec.first_audio_out:
            rec.first_audio_out = time.perf_counter()
            self._playout = playout
            self.turns.on_reply_started(rec.first_audio_out)
            self.tracer.instant("transport", "send_audio", turn=rec.index, flow=rec.index + 1)
            await self._send_state()
        await playout.play(chunk)


class TurnLog:
    """The session's turn records, indexed by absolute turn number, keeping only the last
    `keep` of them (a session can last hours). `len()` is the number of turns ever started."""

    def __init__(self, keep: int = 256):
        self._recent: deque[TurnRecord] = deque(maxlen=keep)
        self._count = 0

    def append(self, rec: TurnRecord) -> None:
        self._recent.append(rec)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def _pos(self, i: int) -> int:
        pos = i - (self._count - len(self._recent))
        if not 0 <= pos < len(self._recent):
            raise IndexError(f"turn {i} is not kept (turns {self._count - len(self._recent)}..{self._count - 1} are)")
        return pos

    def __getitem__(self, i: int) -> TurnRecord:
        return self._recent[self._pos(i)]

    def __setitem__(self, i: int, rec: TurnRecord) -> None:
        self._recent[self._pos(i)] = rec

    def __contains__(self, i: int) -> bool:
        return self._count - len(self._recent) <= i < self._count

    def __iter__(self):
        return iter(self._recent)


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

    def window_levels(self, count: int, window: int) -> list[float]:
        """RMS of the last `count` complete `window`-sample windows of the stream (windows
        aligned with its first sample, as the VAD's are); fewer if the ring no longer holds them."""
        x = self.last_whole(count * window, window)
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


async def _cancel(task: asyncio.Task | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _has_words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


async def _next_async(it):
    return next(it, None)


def _ns(t_seconds: float) -> int:
    """perf_counter seconds -> the tracer's perf_counter_ns clock."""
    return int(t_seconds * 1e9)
