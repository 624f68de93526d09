"""The listener: audio in -> resample -> VAD -> turn machine -> recognizer, emitting turn events.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import numpy as np

from agent.conversation.eou import as_of_pause
from agent.tracing.trace import Ev, Stage
from agent.conversation.turns import (
    CancelReply, DiscardTranscript, EndOfTurn, PauseReply, ResumeReply, SpeechPaused, SpeechResumed, SpeechStopped,
    StartUtterance, State, TurnConfig, TurnMachine)
from agent.workers import cancel_and_wait, run_in
from asr.base import Gap, Partial, RecognizerFailed, RecognizerStream, StreamingRecognizer, Utterances, Word
from asr.ring import AudioRing
from asr.words import HeardWords
from llm.base import ReadAheadStop
from transport.audio import StreamResampler
from transport.base import AudioIn
from tts.chunking import ends_sentence

log = logging.getLogger("duplex.listener")
VAD_RATE = 16000
VAD_FRAME = 512  # samples per VAD window, aligned with the stream's start
VAD_FRAME_S = VAD_FRAME / VAD_RATE


# ---- what the listener tells the session ------------------------------------------------------
@dataclass(frozen=True)
class StateChange:
    state: State


@dataclass(frozen=True)
class UserStarted:
    """The user began an utterance (not yet a turn: it may be a pause's continuation)."""


@dataclass(frozen=True)
class UserSpokeOver:
    """The user began speaking over the bot: hold its audio now (words will tell whether it
    was an interruption)."""

    speech_start: float  # perf_counter time of that speech's first VAD frame


@dataclass(frozen=True)
class UserBargedIn:
    """Words over the bot: a real interruption; the paused reply is cancelled."""


@dataclass(frozen=True)
class HeardPartial:
    text: str
    stable: str


@dataclass(frozen=True)
class PauseTranscript:
    """The transcript up to the current pause, while the user is still silent: speculate on it."""

    text: str


@dataclass(frozen=True)
class UserStopped:
    """The user stopped speaking (maybe only for a moment): their words are being decoded now,
    and read-aheads of the words so far give the decode the cores."""


@dataclass(frozen=True)
class UserResumed:
    """The user went on speaking after a pause: a speculation on it is void."""


@dataclass(frozen=True)
class TurnEnded:
    """The user's turn ended; its transcript follows (`UserTranscript`)."""

    t_speech_end: float  # stream time
    speech_end: float  # perf_counter time of the end of speech
    endpoint: float  # perf_counter time the end of turn was decided


@dataclass(frozen=True)
class UserTranscript:
    """The words of the turn that ended last; empty when it held none (noise)."""

    text: str
    words: tuple[Word, ...]
    at: float  # perf_counter time


@dataclass(frozen=True)
class FalseInterruption:
    """The speech over the bot held no words (noise, a backchannel): play on from the pause."""


@dataclass(frozen=True)
class RecognizerLost:
    message: str


ListenerEvent = (StateChange | UserStarted | UserSpokeOver | UserBargedIn | HeardPartial | PauseTranscript | UserStopped
                 | UserResumed | TurnEnded | UserTranscript | FalseInterruption | RecognizerLost)


@dataclass
class ListenerConfig:
    turns: TurnConfig
    # early decodes run (and speculated on) per user turn; pauses inside a sentence use some
    max_speculations_per_turn: int = 5
    # audio after the end of speech given to the final decode; at most the turn machine's
    # decode_after_s plus one VAD frame, so the early decode and the final see the same audio
    final_pad_s: float = 0.12
    max_words: int = 512  # recognized words not yet taken by a turn (bounded)
    # offer a pause's transcript to speculate on before the text model judges it, so the reply's
    # prompt and first words are computed meanwhile (with two cores or more; on one core's two
    # hyperthreads both would run at half speed, and the end of the turn waits for the verdict)
    speculate_before_verdict: bool = True


class Listener:
    def __init__(self, recognizer: StreamingRecognizer, vad, eou, config: ListenerConfig, tracer,
                 emit: Callable[[ListenerEvent], Awaitable[None]], turn: Callable[[], int] = lambda: 0,
                 echo: Callable[[str], bool] = lambda text: False):
        self.recognizer, self._vad, self.eou, self.config, self.tracer = recognizer, vad, eou, config, tracer
        self._emit = emit
        self._echo = echo  # is this transcript the bot's own voice heard back (agent/conversation/echo.py)?
        self._turn = turn  # the index of the turn being spoken, for the trace
        turns = config.turns
        policy = turns.endpointing
        if policy.uses_text_model and not hasattr(eou, "text_probability"):
            if eou is not None:  # asked for, not given: say so (no models at all: quietly)
                log.warning("the %s end-of-turn policy needs a text turn model (agent.conversation.eou.CombinedEou); "
                            "using %s", policy.name, policy.without_text_model().name)
            turns = replace(turns, endpointing=policy.without_text_model())
        self.turns = TurnMachine(turns)
        # (silence, text, its text turn probability): one check per silence and text, however
        # many callers ask (the early transcript and the pause both may)
        self._text_p: tuple[float, str, asyncio.Task] | None = None
        self.stream: RecognizerStream | None = None
        self._utterances: Utterances | None = None
        self._vad_resampler: StreamResampler | None = None
        self._asr_resampler: StreamResampler | None = None
        self.t_audio = 0.0  # stream time: seconds of audio received
        self._wall_at_t = time.perf_counter()
        self._recent = AudioRing(int(8 * VAD_RATE))  # the end-of-turn model looks at <= 8 s
        self._utt_t0 = 0.0  # stream time where the current utterance starts (preroll included)
        self._words = HeardWords(config.max_words)
        self._pause_decodes = 0
        self._early: tuple[float, float] | None = None  # last early transcript: (speech end, until)
        self._early_text: tuple[float, str] | None = None  # (speech end, text)
        self._early_task: asyncio.Task | None = None
        self._offered: float | None = None  # the silence whose transcript was offered to speculate on
        self._final_task: asyncio.Task | None = None
        self._eou_task: asyncio.Task | None = None
        self._eou_asked: float | None = None
        self._read_ahead_stop = ReadAheadStop()  # the text turn model's current read-ahead
        self._events_task: asyncio.Task | None = None
        self._last_state = self.turns.state
        self._closing = False

    @property
    def state(self) -> State:
        return self.turns.state

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
        await cancel_and_wait(self._early_task, self._final_task, self._eou_task,
                              self._text_p[2] if self._text_p is not None else None)
        if self.stream is not None:
            with contextlib.suppress(Exception):
                await self.stream.close()
        await cancel_and_wait(self._events_task)

    # ---- the reply's progress, from the session --------------------------------------------------
    async def bot_initiated(self) -> bool:
        ok = self.turns.on_bot_initiated(time.perf_counter())
        await self._state_changed()
        return ok

    async def reply_started(self) -> None:
        self.turns.on_reply_started(time.perf_counter())
        await self._state_changed()

    async def reply_finished(self) -> None:
        self.turns.on_reply_finished(time.perf_counter())
        await self._state_changed()

    # ---- audio ------------------------------------------------------------------------------------
    async def on_audio(self, ev: AudioIn) -> None:
        if self._vad_resampler is None or self._vad_resampler.in_rate != ev.sample_rate:
            self._vad_resampler = StreamResampler(ev.sample_rate, VAD_RATE)
        x = self._vad_resampler(ev.pcm)
        if x.size == 0:
            return
        self.t_audio += x.size / VAD_RATE
        self._wall_at_t = time.perf_counter()
        self._recent.push(x)
        await self._feed_recognizer(ev, x)
        probs = await run_in("vad", self._vad, x)
        levels = self._recent.window_levels(len(probs), VAD_FRAME)
        t_first = self.t_audio - x.size / VAD_RATE
        commands = []
        for i, p in enumerate(probs):
            # frames complete at roughly the end of this chunk; spread them back over it
            t = max(t_first, self.t_audio - (len(probs) - 1 - i) * VAD_FRAME_S)
            commands += self.turns.on_vad(t, p, VAD_FRAME_S, levels[i] if i < len(levels) else None)
        await self._run_commands(commands)
        if self._utterances is not None:
            # partials are worth decoding only while the user speaks: the VAD's own view, whatever
            # the turn's state (speech over the bot included)
            self._utterances.speaking(self.turns.in_speech)
        await self._state_changed()

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

    # ---- turn machine commands ------------------------------------------------------------------
    async def _run_commands(self, commands) -> None:
        for cmd in commands:
            await self._on_command(cmd)

    async def _on_command(self, cmd) -> None:
        if isinstance(cmd, PauseReply):
            await self._emit(UserSpokeOver(self.wall_of(cmd.t_speech_start)))
        elif isinstance(cmd, CancelReply):
            await self._emit(UserBargedIn())
        elif isinstance(cmd, StartUtterance):
            self._pause_decodes = 0
            self._early = self._early_text = None
            speech_so_far = self.t_audio - cmd.t_start
            self._utt_t0 = max(0.0, self.t_audio - speech_so_far - self.config.turns.preroll_s)
            self._words.drop_ended_by(self._utt_t0)  # words before the utterance (noise the bot talked over)
            if self._utterances is not None:
                self._utterances.begin_utterance(self._utt_t0)
            await self._emit(UserStarted())
        elif isinstance(cmd, SpeechStopped):
            self._read_ahead_stop.set()  # the decode goes first: beside it, both are slower
            await self._emit(UserStopped())
            until = min(cmd.t_speech_end + self.config.final_pad_s, self.t_audio)
            self._early = (cmd.t_speech_end, until)
            previous = self._early_task
            self._early_task = _spawn(self._early_transcript(cmd.t_speech_end, until, previous), "asr-early")
        elif isinstance(cmd, SpeechPaused):
            self.tracer.instant(Stage.TURN, Ev.PAUSE, turn=self._turn())
            if self.turns.policy.audio_first:
                self._start_eou_check(cmd.t_speech_end)  # unless asked already in this silence
            if self._early_text is not None and self._early_text[0] == cmd.t_speech_end:
                await self._on_pause_transcript(*self._early_text)  # decoded before the pause
        elif isinstance(cmd, SpeechResumed):
            await self._emit(UserResumed())
        elif isinstance(cmd, EndOfTurn):
            now = time.perf_counter()
            t_end = cmd.t_speech_end
            early = self._early
            until = early[1] if early is not None and early[0] == t_end else min(
                t_end + self.config.final_pad_s, self.t_audio)
            turn = self._turn()  # the index the session gives the turn that ended
            await self._emit(TurnEnded(t_end, self.wall_of(t_end), now))
            previous = self._final_task
            self._final_task = _spawn(self._final_transcript(until, previous, turn), "asr-final")
        elif isinstance(cmd, ResumeReply):
            self._words.drop_ended_by(self.t_audio)  # the noise that interrupted holds no words worth keeping
            await self._emit(FalseInterruption())

    async def _state_changed(self) -> None:
        if self.turns.state != self._last_state:
            self._last_state = self.turns.state
            await self._emit(StateChange(self.turns.state))

    # ---- transcripts ------------------------------------------------------------------------------
    def _still_silent_since(self, t_speech_end: float) -> bool:
        """The user has said nothing since the silence that began at `t_speech_end` (the one the
        last early transcript was asked for)."""
        return not self.turns.in_speech and self._early is not None and self._early[0] == t_speech_end

    async def _early_transcript(self, t_end: float, until: float, previous: asyncio.Task | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        # skip it when the user is speaking again or a later silence superseded this one (their
        # next silence asks anew), or when this turn's early transcripts are spent
        if not self._still_silent_since(t_end) or self._pause_decodes >= self.config.max_speculations_per_turn:
            return
        self._pause_decodes += 1
        # the turn model first, alone (~35 ms): beside the decode or the LLM's prompt it would
        # take the cores they need. Its verdict waits in the turn machine for the pause.
        # (a policy that is not `audio_first` asks it after the text score, if at all)
        eou = self._start_eou_check(t_end) if self.turns.policy.audio_first else None
        if eou is not None:
            await asyncio.wait([eou])
            if not self._still_silent_since(t_end):
                return  # the user went on meanwhile: their next silence decodes
        with self.tracer.span(Stage.ASR, Ev.PAUSE_DECODE, turn=self._turn()):
            text, _ = await self._transcript_until(until, take=False)
        self._early_text = (t_end, text)
        if self._still_silent_since(t_end):
            if self.turns.policy.audio_first:
                self._start_eou_check(t_end)  # if the model was busy with an earlier silence
            await self._on_pause_transcript(t_end, text)

    async def _on_pause_transcript(self, t_end: float, text: str) -> None:
        """Speculate on the transcript (the session decides whether) and let the turn machine
        judge whether it ends a sentence. Only while the user is silent and the turn not taken."""
        def open_turn() -> bool:
            return not self.turns.in_speech and self.turns.state in (State.USER_SPEAKING, State.ENDPOINT_PENDING)

        if not open_turn() or not any(ch.isalnum() for ch in text):
            return
        if self.config.speculate_before_verdict:  # a verdict that ends the turn commits it
            await self._offer(t_end, text)
        text_p = None
        if self.turns.policy.uses_text_model:  # one text turn check per silence and text
            if self._text_p is None or self._text_p[:2] != (t_end, text):
                self._text_p = (t_end, text, _spawn(self._text_turn_check(text), "text-turn"))
            text_p = await asyncio.shield(self._text_p[2])
            if not open_turn():
                return  # the user went on meanwhile
        await self._run_commands(self.turns.on_transcript(self.t_audio, ends_sentence(text), text_p, t_end))
        # (judged first: a turn this verdict ended has its final next, the same decode, cached)
        if open_turn():
            await self._offer(t_end, text)
        if not self.turns.policy.audio_first and open_turn() and self.turns.wants_audio_verdict():
            if self._eou_task is not None and not self._eou_task.done():
                await asyncio.wait([self._eou_task])  # an earlier silence's: the policy waits for this one's
            if open_turn():
                self._start_eou_check(t_end)

    async def _offer(self, t_end: float, text: str) -> None:
        if self._offered != t_end:  # once per silence (before the pause, or at it)
            self._offered = t_end
            await self._emit(PauseTranscript(text))

    async def _text_turn_check(self, text: str) -> float:
        with self.tracer.span(Stage.TURN, Ev.TEXT_TURN_CHECK, turn=self._turn()):
            return await run_in("eou", self.eou.text_probability, text)

    async def _read_ahead(self, partial: str) -> None:
        """Have the text turn model read the words so far while the user speaks a turn, so that
        the check at the pause, which the turn's end waits for, reads only the words after them
        (one token: ~20 ms instead of ~40-60). Not over the bot. Before the session hears of the
        partial: the LLM's own read-ahead of it (agent/conversation/session.py `_warm`) then runs alone, and
        both end sooner than side by side on two cores."""
        read = getattr(self.eou, "warm_text", None)
        if (read is None or not self.turns.policy.uses_text_model or not self.turns.in_speech
                or self.turns.state != State.USER_SPEAKING):
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

    async def _final_transcript(self, until: float, previous: asyncio.Task | None, turn: int) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        with self.tracer.span(Stage.ASR, Ev.FINAL_DECODE, turn=turn):
            text, words = await self._transcript_until(until, take=True)
        if text and self._is_echo(text):
            text, words = "", ()  # the bot's own words: no interruption, no turn to answer
        commands = self.turns.on_final(time.perf_counter(), text)
        if any(isinstance(c, DiscardTranscript) and c.echo for c in commands):
            self.tracer.instant(Stage.TURN, Ev.ECHO, turn=self._turn(), text=text, quiet=True)
        # noise or backchannels over the bot are no turn to answer
        keep = any(ch.isalnum() for ch in text) and not any(isinstance(c, DiscardTranscript) for c in commands)
        # a cancel or a resume first: the reply it decides on goes before a new one starts
        await self._run_commands(commands)
        await self._emit(UserTranscript(text if keep else "", words if keep else (), time.perf_counter()))
        await self._state_changed()

    async def _transcript_until(self, until: float, take: bool) -> tuple[str, tuple[Word, ...]]:
        """The words said by stream time `until`: an early decode (not taken), or a flush of the
        stream; `take`: they belong to the turn that ended and leave the buffer."""
        if not take and self._utterances is not None:
            hyp = await self._utterances.decode_early(until)
            return hyp.text, hyp.words
        await self._words.flush(self.stream, until)
        return self._words.take(until, keep=not take)

    async def _read_events(self) -> None:
        try:
            async for ev in self.stream.events():
                if self._words.on_event(ev):
                    continue
                if isinstance(ev, Partial):
                    self.tracer.instant(Stage.ASR, Ev.PARTIAL, turn=self._turn(), text=ev.text)
                    await self._read_ahead(ev.text)
                    await self._emit(HeardPartial(ev.text, ev.stable_text))
                    own = self._is_echo(ev.text)
                    # only words the recognizer will not take back make an interruption: a
                    # partial's tail can be a guess (half a hum over a phone line: "and and making")
                    await self._run_commands(self.turns.on_words(self.t_audio, "" if own else ev.stable_text))
                    await self._state_changed()
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

    # ---- end-of-turn model ----------------------------------------------------------------------
    def _start_eou_check(self, t_speech_end: float) -> asyncio.Task | None:
        """Ask the end-of-turn model about the utterance up to this silence (once per silence)."""
        eou = self.eou
        if eou is None or not self.turns.policy.uses_audio_model or self._eou_asked == t_speech_end:
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
            p = await run_in("eou", eou.probability, audio)
            self.tracer.complete(Stage.TURN, Ev.EOU_CHECK, ts_ns=int(t0 * 1e9),
                                 dur_ns=int((time.perf_counter() - t0) * 1e9), turn=self._turn(), probability=round(p, 3))
            await self._run_commands(self.turns.on_eou(self.t_audio, p, t_speech_end))
            await self._state_changed()

        self._eou_task = _spawn(check(), "eou")
        return self._eou_task


def _spawn(coro, name: str) -> asyncio.Task:
    """A task of the listener's; a failure in it is logged at once, not when it is collected."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("listener task %s failed", task.get_name(), exc_info=task.exception())
