"""One conversation: the wiring of a listener, the reply pipeline and the history.

transport audio -> `Listener` (VAD, turns, recognizer) -> turn events -> here: start, commit or
cancel a `Reply` (LLM -> TTS -> playout), pause it the moment the user speaks over it, then cut
it (words: a barge-in) or resume it where its audio stopped (no words: a false interruption),
and keep the `History`. The parts are in their own modules; this one decides.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import time
from collections import deque

from agent import listener as heard
from agent.echo import is_echo
from agent.history import History
from agent.config import DEFAULT_SYSTEM_PROMPT, Models, SessionConfig  # noqa: F401 - the session's API
from agent.listener import Listener
from agent.records import TurnLog, TurnRecord
from agent.replies import Replies
from agent.reply import Reply
from agent.trace import Ev, NullTracer, Stage, Tracer
from agent.turns import State
from agent.workers import cancel_and_wait, run_in
from asr.base import RecognizerUnavailable
from llm.base import ReadAheadStop
from transport.base import AudioIn, ClientEvent, Played, Transport
from transport.events import (
    BotDone, EndOfUserTurn, FinalTranscript, Interrupted, PartialTranscript, SessionError, SessionEvent,
    StateChanged, TurnLatency)

log = logging.getLogger("duplex.session")

# said on a line whose recognizer has no room: a phone has no screen to show the error
APOLOGY = "Sorry, I can't take your call right now. Please try again later."


class Session:
    def __init__(self, models: Models, transport: Transport, config: SessionConfig | None = None,
                 tracer=None, session_id: str = "s0"):
        self.models, self.transport = models, transport
        self.config = config or SessionConfig()
        self.tracer: Tracer = tracer if tracer is not None else NullTracer(session_id)
        self.session_id = session_id
        self.records = TurnLog()
        self._history = History(self.config.max_history_messages, on_new_prefix=lambda: self._warm(""))
        self.listener = Listener(models.asr, models.vad_factory(), models.eou, self.config.listener(), self.tracer,
                                 self._on_heard, turn=lambda: len(self.records), echo=self._is_echo)
        self.replies = Replies(self._new_reply, self._history, self.records, transport, self.tracer)
        self._awaiting_final: deque[TurnRecord] = deque(maxlen=8)  # turns ended, transcript to come
        self._warm_task: asyncio.Task | None = None
        self._warm_stop = ReadAheadStop()  # the current warm's
        self._chunk_ids = itertools.count()
        self._greeting_due = bool(self.config.greeting)
        self._ended = False  # run() is ending: warm no more prompts (their work would be wasted)
        self._stop = asyncio.Event()  # the conversation cannot go on (its recognizer is lost)

    @property
    def history(self) -> list:
        return self._history.messages

    @property
    def speculation_stats(self) -> dict:
        return self.replies.stats.as_dict()

    # ---- main loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self.listener.open()
        except RecognizerUnavailable as e:
            log.warning("%s: no recognizer: %s", self.session_id, e)
            await self._give_up("no_recognizer", str(e))
            return
        self._warm(None)  # the system prompt, before the first turn needs it
        try:
            await self._send_state()
            # a far end sends audio every few tens of ms, so a stop is seen at the next event
            while not self._stop.is_set():
                event = await self.transport.receive()
                if event is None:
                    break
                if isinstance(event, AudioIn):
                    if self._greeting_due:
                        await self._greet()
                    await self.listener.on_audio(event)
                elif isinstance(event, Played):
                    self._on_played(event)
                elif isinstance(event, ClientEvent):
                    self._on_client_event(event)
        finally:
            self._ended = True
            await self.replies.end_with_session("session ended")
            self._warm_stop.set()  # the model's thread is not kept reading for no one
            await cancel_and_wait(self._warm_task)
            await self.listener.close()

    async def hang_up(self, code: str, message: str, spoken: str) -> None:
        """End the conversation from this side (a server that drains): what plays stops, the
        page is told why, `spoken` is said (a phone has no screen), and `run` returns."""
        self._ended = True
        await self.replies.end_with_session(message)
        await self._give_up(code, message, spoken)
        self._stop.set()

    async def _give_up(self, code: str, message: str, spoken: str = APOLOGY) -> None:
        """The conversation cannot go on: say so (the page shows it; a phone hears `spoken`)."""
        self._ended = True
        await self._send(SessionError(code, message, fatal=True))
        rec = TurnRecord(index=len(self.records))
        reply = self.replies.start(rec, None, fixed_text=spoken)
        with contextlib.suppress(Exception):
            await reply.task

    async def _send(self, event: SessionEvent) -> None:
        with contextlib.suppress(Exception):  # a UI event must never kill the session
            await self.transport.send_event(event)

    async def _send_state(self) -> None:
        state = self.listener.state
        await self._send(StateChanged(state.value, busy=state in (State.THINKING, State.BOT_SPEAKING)))

    # ---- what the listener heard ---------------------------------------------------------------
    async def _on_heard(self, ev) -> None:
        turn = len(self.records)
        if isinstance(ev, heard.StateChange):
            await self._send_state()
        elif isinstance(ev, heard.UserStarted):
            self.tracer.instant(Stage.TURN, Ev.USER_SPEECH_START, turn=turn)
        elif isinstance(ev, heard.UserSpokeOver):
            # the bot yields at the user's first frames: words will tell whether to cut or resume
            self.tracer.instant(Stage.TURN, Ev.BARGE_IN, turn=turn - 1)
            if await self.replies.pause():
                self.tracer.instant(Stage.TURN, Ev.REPLY_PAUSED, turn=turn - 1,
                                    speech_to_clear_ms=round((time.perf_counter() - ev.speech_start) * 1000, 1))
        elif isinstance(ev, heard.UserBargedIn):
            heard_text = await self.replies.barge_in()
            await self._send(Interrupted(heard_text))
        elif isinstance(ev, heard.HeardPartial):
            await self._send(PartialTranscript(ev.text, ev.stable))
            # the LLM reads the words so far while the user goes on; not once they stopped,
            # nor while a reply is on (a barge-in: its history is not settled yet), nor in
            # waterfall mode (its LLM sees nothing before the final transcript)
            if (self.listener.turns.in_speech and self.listener.state == State.USER_SPEAKING
                    and self.replies.current is None and self.replies.branch is None
                    and self.config.mode == "concurrent"):
                self._warm(ev.text)
        elif isinstance(ev, heard.PauseTranscript):
            if self.config.speculate and self.config.mode == "concurrent":
                self.replies.speculate(ev.text)
        elif isinstance(ev, heard.UserStopped):
            self._warm_stop.set()  # the decode of their words needs the cores more than the read-ahead
        elif isinstance(ev, heard.UserResumed):
            self.tracer.instant(Stage.TURN, Ev.SPEECH_RESUMED, turn=turn)
            await self.replies.cancel_branch("user went on speaking")
        elif isinstance(ev, heard.TurnEnded):
            rec = TurnRecord(index=turn, speech_end=ev.speech_end, endpoint=ev.endpoint)
            self.records.append(rec)
            self._awaiting_final.append(rec)
            self.tracer.instant(Stage.TURN, Ev.USER_SPEECH_END, turn=rec.index, ts_ns=_ns(rec.speech_end))
            self.tracer.instant(Stage.TURN, Ev.ENDPOINT, turn=rec.index, ts_ns=_ns(rec.endpoint))
            await self._send(EndOfUserTurn(rec.index, rec.speech_end * 1000, round(ev.t_speech_end, 3)))
        elif isinstance(ev, heard.UserTranscript):
            if not self._awaiting_final:
                log.error("%s: a transcript with no turn waiting for it", self.session_id)
                return
            rec = self._awaiting_final.popleft()
            rec.asr_final, rec.user_text = ev.at, ev.text
            self.tracer.instant(Stage.ASR, Ev.FINAL, turn=rec.index, text=ev.text)
            await self._send(FinalTranscript(rec.index, ev.text,
                                             tuple((w.text, round(w.start, 3), round(w.end, 3)) for w in ev.words)))
            # the turn is the bot's to answer; or the user speaks over its thinking (a new reply
            # starts held, and plays if that proves no interruption)
            await self.replies.answer(rec, start_new=self.listener.state in (State.THINKING, State.INTERRUPTED))
        elif isinstance(ev, heard.FalseInterruption):
            if not self.replies.resume():
                await self.listener.reply_finished()
        elif isinstance(ev, heard.RecognizerLost):
            log.warning("%s: recognizer lost: %s", self.session_id, ev.message)
            await self.replies.end_with_session("recognizer lost")
            await self._give_up("recognizer_lost", ev.message)
            self._stop.set()

    def _on_played(self, ev: Played) -> None:
        if self.replies.current is not None and ev.event == "start":
            self.replies.current.playout.on_played(ev.chunk_id, ev.server_time)
        ts = _ns(ev.server_time) if ev.server_time is not None else None
        self.tracer.instant(Stage.CLIENT, Ev.PLAYOUT_START if ev.event == "start" else Ev.PLAYOUT_END,
                            turn=len(self.records) - 1, ts_ns=ts, chunk=ev.chunk_id)

    def _on_client_event(self, ev: ClientEvent) -> None:
        if ev.kind == "metrics":
            turn, m2e = ev.data.get("turn"), ev.data.get("mouth_to_ear_ms")
            if isinstance(turn, int) and turn in self.records and isinstance(m2e, (int, float)):
                self.records[turn].mouth_to_ear_ms = round(float(m2e), 1)
                self.tracer.instant(Stage.CLIENT, Ev.MOUTH_TO_EAR, turn=turn, ms=float(m2e))
            return
        self.tracer.instant(Stage.CLIENT, ev.kind, **{k: v for k, v in ev.data.items() if isinstance(v, (int, float, str))})

    # ---- replies ----------------------------------------------------------------------------------
    def _new_reply(self, rec: TurnRecord, user_text: str | None, **kw) -> Reply:
        messages = self._history.prompt(self.config.system_prompt, user_text)
        return Reply(rec, messages, llm=self.models.llm, tts=self.models.tts, transport=self.transport,
                     config=self.config.reply(), tracer=self.tracer, new_chunk_id=lambda: next(self._chunk_ids),
                     hooks=self, **kw)

    async def _greet(self) -> None:
        """Speak the greeting as a reply of its own: a turn with no user words."""
        self._greeting_due = False
        rec = TurnRecord(index=len(self.records), endpoint=time.perf_counter())
        if not await self.listener.bot_initiated():
            return  # the user spoke first
        self.records.append(rec)
        self.tracer.instant(Stage.TURN, Ev.GREETING, turn=rec.index, text=self.config.greeting)
        self.replies.start(rec, "", fixed_text=self.config.greeting)

    # ---- ReplyHooks ---------------------------------------------------------------------------------
    async def send(self, event: SessionEvent) -> None:
        await self._send(event)

    async def reply_audible(self, reply: Reply) -> None:
        await self.listener.reply_started()

    def _is_echo(self, text: str) -> bool:
        """`text`, heard while a reply is on, is the bot's own voice come back. Once it has
        ended, nothing is: a user's answer often repeats a word of the question."""
        reply = self.replies.current
        return reply is not None and is_echo(text, reply.playout.sent_text())

    async def reply_finished(self, reply: Reply) -> None:
        rec = reply.record
        self._history.remember(rec.user_text, reply.spoken)
        self.replies.finished(reply)
        await self.listener.reply_finished()
        await self._send(BotDone(rec.index, rec.reply_text))
        await self._send(TurnLatency(rec.summary()))

    async def reply_failed(self, reply: Reply, error: BaseException) -> None:
        """A committed reply failed (its LLM down, stalled or cut off; its voice or the line
        broken). The reply has recorded the error in its turn and, for an LLM failure, spoken
        its apology. The history keeps what was heard of the answer, never the apology (the LLM
        did not say it); when nothing was heard the exchange is not kept at all: the user was
        asked to say it again, and the roles still alternate for strict chat templates. The
        conversation goes on: the page is told (not fatal), and the next turn asks the LLM anew."""
        rec = reply.record
        rec.error = rec.error or str(error) or type(error).__name__
        if reply.spoken:
            self._history.remember(rec.user_text, reply.spoken)
        self.replies.finished(reply)
        await self.listener.reply_finished()
        await self._send(SessionError("reply_failed", rec.error))
        await self._send(TurnLatency(rec.summary()))

    # ---- prompt warming -----------------------------------------------------------------------------
    def _warm(self, user_so_far: str | None) -> None:
        """Have the LLM evaluate a prompt prefix now, while the user speaks, instead of in the
        next turn's time to first token: a new prefix (the session's start, or the history just
        cut), or the user's words so far (a partial transcript; the final prompt shares every
        token up to the words that changed)."""
        warm = getattr(self.models.llm, "warm", None)
        if warm is None or self._ended or (self._warm_task is not None and not self._warm_task.done()):
            return
        messages = self._history.prompt(self.config.system_prompt, user_so_far)
        self._warm_stop = stop = ReadAheadStop()
        # a warmer written before `stop` existed reads ahead to the end, as it always did
        args = (messages, stop) if "stop" in inspect.signature(warm).parameters else (messages,)

        async def run() -> None:
            span = self.tracer.begin(Stage.LLM, Ev.WARM_CACHE, turn=len(self.records), messages=len(messages),
                                     user_words=len((user_so_far or "").split()))
            try:
                await run_in("llm-warm", warm, *args)
            finally:
                self.tracer.end(span, stopped=stop.is_set())

        self._warm_task = asyncio.create_task(run(), name="llm-warm")


def _ns(t_seconds: float) -> int:
    """perf_counter seconds -> the tracer's perf_counter_ns clock."""
    return int(t_seconds * 1e9)
