"""The listener: audio in -> resample -> VAD -> `ListenMachine` -> recognizer, emitting turn events.

A thin asyncio shell over a pure machine (agent/conversation/listening.py, which holds the turn
machine and makes every decision): it resamples, runs the VAD and the models on their workers,
feeds the recognizer stream, keeps the tasks and the trace, and carries out the machine's
commands in order, feeding back what they answer.

The recognizer stream is fed every sample of the conversation, silence included (a streaming
model keeps its context). At the end of a turn the listener flushes the stream up to the end of
speech and takes the words that end before it, by word time. At a pause it asks for the
transcript so far, so the session can speculate: an early decode where the recognizer has one
(`asr.base.Utterances`, Whisper), else a flush (a causal model pushes silence through its delay).
The end-of-turn model is asked at the first silent frame, alone, before that transcript.

Everything it learns goes to the session as one of the typed events below, in order.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import numpy as np

from agent.conversation.eou import as_of_pause
from agent.conversation.listening import (
    AwaitAudioCheck, AwaitTextTurn, BeginUtterance, CheckAudioTurn, CheckTextTurn, Command, DecodeEarly, DropWords,
    Emit, EndTurn, FalseInterruption, HeardPartial, ListenerConfig, ListenerEvent, ListenMachine, LookAtOverlap, Note,
    PauseTranscript,
    QueueEarlyDecode, ReadAhead, RecognizerLost, Speaking, SpokeOver, StateChange, StopReadAhead, Transcript,
    TurnEnded, UserBargedIn, UserResumed, UserSpokeOver, UserStarted, UserStopped, UserTranscript)
from agent.conversation.turned_away import STEP_S
from agent.conversation.turns import State, TurnMachine
from agent.tracing.trace import Ev, Stage
from agent.workers import cancel_and_wait, run_in
from asr.base import SPEECH_RATE as VAD_RATE
from asr.base import Gap, Partial, RecognizerFailed, RecognizerStream, StreamingRecognizer, Utterances, Word
from asr.ring import AudioRing, merged_levels
from asr.vad import FRAME as VAD_FRAME
from asr.words import HeardWords
from llm.base import ReadAheadStop
from transport.audio import StreamResampler
from transport.base import AudioIn

# the events and the config live beside the machine that decides them; the session reads them here
__all__ = ["Listener", "ListenerConfig", "ListenerEvent", "StateChange", "UserStarted", "UserSpokeOver", "UserBargedIn",
           "HeardPartial", "PauseTranscript", "UserStopped", "UserResumed", "TurnEnded", "UserTranscript",
           "FalseInterruption", "RecognizerLost", "VAD_RATE", "VAD_FRAME", "VAD_FRAME_S"]

log = logging.getLogger("duplex.listener")
VAD_FRAME_S = VAD_FRAME / VAD_RATE
STEPS_PER_FRAME = round(VAD_FRAME_S / STEP_S)  # the turned-away judgement's level steps in a VAD frame


class Listener:
    def __init__(self, recognizer: StreamingRecognizer, vad, eou, config: ListenerConfig, tracer,
                 emit: Callable[[ListenerEvent], Awaitable[None]], turn: Callable[[], int] = lambda: 0,
                 echo: Callable[[str], bool] = lambda text: False):
        self.recognizer, self._vad, self.eou, self.config, self.tracer = recognizer, vad, eou, config, tracer
        self._emit = emit
        self._echo = echo  # is this transcript the bot's own voice heard back (agent/conversation/echo.py)?
        self._turn = turn  # the index of the turn being spoken, for the trace
        self.machine = ListenMachine(config, audio_model=eou is not None,
                                     text_model=hasattr(eou, "text_probability"))
        if self.machine.fell_back_from is not None and eou is not None:
            # asked for, not given: say so (no models at all: quietly)
            log.warning("the %s end-of-turn policy needs a text turn model (agent.conversation.eou.CombinedEou); "
                        "using %s", self.machine.fell_back_from, self.machine.policy.name)
        self.stream: RecognizerStream | None = None
        self._utterances: Utterances | None = None
        self._vad_resampler: StreamResampler | None = None
        self._asr_resampler: StreamResampler | None = None
        self._wall_at_t = time.perf_counter()
        self._recent = AudioRing(int(8 * VAD_RATE))  # the end-of-turn model looks at <= 8 s
        self._words = HeardWords(config.max_words)
        self._early_task: asyncio.Task | None = None  # the last early decode queued
        self._final_task: asyncio.Task | None = None  # the last final decode queued
        self._eou_task: asyncio.Task | None = None  # the last smart-turn check
        self._text_task: asyncio.Task | None = None  # the last text turn check
        self._look_task: asyncio.Task | None = None  # the last look at the words of speech over the bot
        self._read_ahead_stop = ReadAheadStop()  # the text turn model's current read-ahead
        self._events_task: asyncio.Task | None = None
        self._closing = False

    @property
    def turns(self) -> TurnMachine:
        return self.machine.turns

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def t_audio(self) -> float:
        """Stream time: seconds of audio received."""
        return self.machine.t_audio

    def wall_of(self, t_stream: float) -> float:
        """perf_counter time at which stream time `t_stream` arrived (audio comes in real time)."""
        return self._wall_at_t - (self.t_audio - t_stream)

    # ---- lifetime ---------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the recognizer stream (raises asr.base.RecognizerUnavailable when it has no room)."""
        self.stream = await self.recognizer.open_stream()
        self._utterances = self.stream if isinstance(self.stream, Utterances) else None
        if self._utterances is not None:
            self._utterances.speaking(False)  # until the VAD hears speech: no decodes of silence
        self._events_task = _spawn(self._read_events(), "asr-events")

    async def close(self) -> None:
        self._closing = True
        self._read_ahead_stop.set()
        await cancel_and_wait(self._early_task, self._final_task, self._eou_task, self._text_task, self._look_task)
        if self.stream is not None:
            with contextlib.suppress(Exception):
                await self.stream.close()
        await cancel_and_wait(self._events_task)

    # ---- the reply's progress, from the session --------------------------------------------------
    async def bot_initiated(self) -> bool:
        ok = self.machine.on_bot_initiated(time.perf_counter())
        await self._carry_out(self.machine.report_state())
        return ok

    async def reply_started(self) -> None:
        await self._carry_out(self.machine.on_reply_started(time.perf_counter()))

    async def reply_finished(self, asked: bool = False) -> None:
        """The reply ended (played, failed, or nothing left to resume); `asked`: its last words
        asked the user something."""
        await self._carry_out(self.machine.on_reply_finished(time.perf_counter(), asked))

    # ---- audio ------------------------------------------------------------------------------------
    async def on_audio(self, ev: AudioIn) -> None:
        if self._vad_resampler is None or self._vad_resampler.in_rate != ev.sample_rate:
            self._vad_resampler = StreamResampler(ev.sample_rate, VAD_RATE)
        x = self._vad_resampler(ev.pcm)
        if x.size == 0:
            return
        self.machine.on_audio(x.size / VAD_RATE)
        self._wall_at_t = time.perf_counter()
        self._recent.push(x)
        await self._feed_recognizer(ev, x)
        probs = await run_in("vad", self._vad, x)
        steps = self._recent.window_levels(len(probs) * STEPS_PER_FRAME, VAD_FRAME // STEPS_PER_FRAME, VAD_FRAME)
        levels = merged_levels(steps, STEPS_PER_FRAME)
        await self._carry_out(self.machine.on_vad(probs, levels, x.size / VAD_RATE, VAD_FRAME_S, steps))

    async def _feed_recognizer(self, ev: AudioIn, x16: np.ndarray) -> None:
        rate = self.stream.sample_rate
        if rate == VAD_RATE:
            pcm = x16
        else:
            if self._asr_resampler is None or self._asr_resampler.in_rate != ev.sample_rate:
                self._asr_resampler = StreamResampler(ev.sample_rate, rate)
            pcm = self._asr_resampler(ev.pcm)
        if pcm.size:
            await self.stream.feed(pcm)

    # ---- the machine's commands -------------------------------------------------------------------
    async def _carry_out(self, commands: Iterable[Command]) -> None:
        """Each command in turn: the machine decides the next one once this one is done."""
        for c in commands:
            await self._do(c)

    async def _do(self, c: Command) -> None:
        m = self.machine
        match c:
            case Emit(event):
                await self._emit(event)
            case SpokeOver(t_speech_start):
                await self._emit(UserSpokeOver(self.wall_of(t_speech_start)))
            case EndTurn(t_end, until):
                now = time.perf_counter()
                turn = self._turn()  # the index the session gives the turn that ended
                await self._emit(TurnEnded(t_end, self.wall_of(t_end), now))
                previous = self._final_task
                self._final_task = _spawn(self._final_transcript(until, previous, turn), "asr-final")
            case Transcript(text, words):
                await self._emit(UserTranscript(text, words, time.perf_counter()))
            case DropWords(before):
                self._words.drop_ended_by(before)
            case BeginUtterance(t_start):
                if self._utterances is not None:
                    self._utterances.begin_utterance(t_start)
            case Speaking(active):
                if self._utterances is not None:
                    self._utterances.speaking(active)
            case ReadAhead(text):
                await self._read_ahead(text)
            case StopReadAhead():
                self._read_ahead_stop.set()
            case QueueEarlyDecode(t_end, until):
                previous = self._early_task
                self._early_task = _spawn(self._early_transcript(t_end, until, previous), "asr-early")
            case DecodeEarly(t_end, until, quick):
                with self.tracer.span(Stage.ASR, Ev.PAUSE_DECODE, turn=self._turn()):
                    text, _ = await self._transcript_until(until, take=False, quick=quick)
                await self._carry_out(m.on_early_transcript(
                    t_end, text, echo=bool(text) and m.turns.overlap_undecided and self._is_echo(text)))
            case LookAtOverlap(until):
                self._look_task = _spawn(self._look_at_overlap(until), "asr-look")
            case CheckAudioTurn(t_end, heard_silence_s, pause_s):
                # up to the last VAD frame, so that the silence after the speech is the same
                # whatever the transport's chunking (smart-turn's verdict can flip with 32 ms more of it)
                audio = as_of_pause(self._recent.last_whole(self._recent.capacity, VAD_FRAME), heard_silence_s, pause_s)
                self._eou_task = _spawn(self._audio_check(t_end, audio), "eou")
            case AwaitAudioCheck():
                if self._eou_task is not None and not self._eou_task.done():
                    await asyncio.wait([self._eou_task])
            case CheckTextTurn(t_end, text):
                self._text_task = _spawn(self._text_turn_check(text), "text-turn")
                p = await asyncio.shield(self._text_task)
                await self._carry_out(m.on_text_verdict(t_end, text, p))
            case AwaitTextTurn(t_end, text):
                p = await asyncio.shield(self._text_task)
                await self._carry_out(m.on_text_verdict(t_end, text, p))
            case Note(ev, fields):
                self.tracer.instant(Stage.TURN, ev, turn=self._turn(), **dict(fields))
            case _:
                raise TypeError(f"not a listener command: {c!r}")

    # ---- the work the commands start ----------------------------------------------------------------
    async def _early_transcript(self, t_end: float, until: float, previous: asyncio.Task | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        await self._carry_out(self.machine.on_early_turn(t_end, until))

    async def _final_transcript(self, until: float, previous: asyncio.Task | None, turn: int) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        with self.tracer.span(Stage.ASR, Ev.FINAL_DECODE, turn=turn):
            text, words = await self._transcript_until(until, take=True)
        echo = bool(text) and self._is_echo(text)
        await self._carry_out(self.machine.on_final(time.perf_counter(), text, words, echo))

    async def _transcript_until(self, until: float, take: bool, quick: bool = False) -> tuple[str, tuple[Word, ...]]:
        """The words said by stream time `until`: an early decode (not taken; `quick`: no second
        look), or a flush of the stream; `take`: they belong to the turn that ended and leave the buffer."""
        if not take and self._utterances is not None:
            hyp = await self._utterances.decode_early(until, quick=quick)
            return hyp.text, hyp.words
        await self._words.flush(self.stream, until)
        return self._words.take(until, keep=not take)

    async def _look_at_overlap(self, until: float) -> None:
        try:
            if self._utterances is None:
                return  # a recognizer of streams: its partials alone tell
            span = self.tracer.begin(Stage.ASR, Ev.OVERLAP_LOOK, turn=self._turn())
            text = ""
            try:
                text = await self._utterances.words_so_far(until)
            finally:
                self.tracer.end(span, text=text)
            await self._carry_out(self.machine.on_overlap_look(text, echo=bool(text) and self._is_echo(text)))
        finally:
            await self._carry_out(self.machine.on_overlap_look_ended())

    async def _audio_check(self, t_end: float, audio: np.ndarray) -> None:
        try:
            t0 = time.perf_counter()
            p = await run_in("eou", self.eou.probability, audio)
            self.tracer.complete(Stage.TURN, Ev.EOU_CHECK, ts_ns=int(t0 * 1e9),
                                 dur_ns=int((time.perf_counter() - t0) * 1e9), turn=self._turn(), probability=round(p, 3))
            await self._carry_out(self.machine.on_audio_verdict(p, t_end))
        finally:
            self.machine.on_audio_check_ended()

    async def _text_turn_check(self, text: str) -> float:
        with self.tracer.span(Stage.TURN, Ev.TEXT_TURN_CHECK, turn=self._turn()):
            return await run_in("eou", self.eou.text_probability, text)

    async def _read_ahead(self, partial: str) -> None:
        read = getattr(self.eou, "warm_text", None)
        if read is None:
            return
        self._read_ahead_stop = stop = ReadAheadStop()
        span = self.tracer.begin(Stage.TURN, Ev.TEXT_TURN_WARM, turn=self._turn())
        try:
            await run_in("eou", read, partial, stop)
        finally:
            self.tracer.end(span, stopped=stop.is_set())

    def _is_echo(self, text: str) -> bool:
        if not self._echo(text):
            return False
        self.tracer.instant(Stage.TURN, Ev.ECHO, turn=self._turn(), text=text)
        return True

    async def _read_events(self) -> None:
        try:
            async for ev in self.stream.events():
                if self._words.on_event(ev):
                    continue
                if isinstance(ev, Partial):
                    self.tracer.instant(Stage.ASR, Ev.PARTIAL, turn=self._turn(), text=ev.text)
                    await self._carry_out(self.machine.on_partial(ev.text, ev.stable_text))
                    own = self._is_echo(ev.text)
                    await self._carry_out(self.machine.on_words(ev.stable_text, echo=own))
                elif isinstance(ev, Gap):
                    log.warning("recognizer gap %.2f-%.2f s: %s", ev.start_s, ev.end_s, ev.reason)
                    self.tracer.instant(Stage.ASR, Ev.GAP, turn=self._turn(), start_s=ev.start_s, end_s=ev.end_s,
                                        reason=ev.reason)
        except RecognizerFailed as e:
            if not self._closing:
                await self._emit(RecognizerLost(str(e)))
            return
        if not self._closing:
            await self._emit(RecognizerLost("the recognizer stream ended"))


def _spawn(coro, name: str) -> asyncio.Task:
    """A task of the listener's; a failure in it is logged at once, not when it is collected."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("listener task %s failed", task.get_name(), exc_info=task.exception())
