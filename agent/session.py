"""One conversation: the wiring of a listener, the reply pipeline and the history.

transport audio -> `Listener` (VAD, turns, recognizer) -> turn events -> here: start, commit or
cancel a `Reply` (LLM -> TTS -> playout), cut it on barge-in and resume it on a false
interruption, and keep the `History`. The parts are in their own modules; this one decides.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agent import listener as heard
from agent.history import History, Resumable, cut_reply
from agent.listener import Listener, ListenerConfig
from agent.records import TurnLog, TurnRecord
from agent.reply import Reply, ReplyConfig
from agent.speculation import SpeculationStats, same_transcript
from agent.trace import Ev, NullTracer, Stage, Tracer
from agent.turns import State, TurnConfig
from agent.workers import run_in
from asr.base import RecognizerUnavailable, StreamingRecognizer
from llm.base import ChatModel
from transport.base import AudioIn, ClientEvent, Played, Transport
from transport.events import (
    BotDone, EndOfUserTurn, FinalTranscript, Interrupted, PartialTranscript, SessionError, SessionEvent,
    StateChanged, TurnLatency)
from tts.base import Synthesizer

log = logging.getLogger("duplex.session")

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Reply in one or two short, plain English sentences.")
# said on a line whose recognizer has no room: a phone has no screen to show the error
APOLOGY = "Sorry, I can't take your call right now. Please try again later."


@dataclass
class SessionConfig:
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    mode: str = "concurrent"  # "concurrent" | "waterfall"
    turns: TurnConfig = field(default_factory=TurnConfig)
    # context kept for the LLM; when it overflows, it is cut back to half in one go
    max_history_messages: int = 16
    max_tokens: int = 80
    first_chunk_words: int = 2
    playout_lead_s: float = 0.4
    piece_s: float = 0.1
    text_queue: int = 8
    speculate: bool = True  # start ASR final + LLM + TTS at a pause, before the turn is confirmed
    # spoken when the far end's audio first arrives (a phone line or the page's microphone is
    # live); the context keeps it as the assistant's first message (what was heard of it)
    greeting: str | None = None
    max_speculations_per_turn: int = 5
    final_pad_s: float = 0.12

    def reply(self) -> ReplyConfig:
        return ReplyConfig(self.mode, self.max_tokens, self.first_chunk_words, self.playout_lead_s, self.piece_s,
                           self.text_queue)

    def listener(self) -> ListenerConfig:
        return ListenerConfig(self.turns, self.max_speculations_per_turn, self.final_pad_s)


@dataclass
class Models:
    asr: StreamingRecognizer
    llm: ChatModel
    tts: Synthesizer
    vad_factory: Callable[[], object]  # -> a callable scoring 16 kHz audio into 32 ms frame probs
    eou: object | None = None  # end-of-turn model: .probability(float32 16 kHz audio) -> float


class Session:
    def __init__(self, models: Models, transport: Transport, config: SessionConfig | None = None,
                 tracer=None, session_id: str = "s0"):
        self.models, self.transport = models, transport
        self.config = config or SessionConfig()
        self.tracer: Tracer = tracer if tracer is not None else NullTracer(session_id)
        self.session_id = session_id
        self.records = TurnLog()
        self.spec = SpeculationStats()
        self._history = History(self.config.max_history_messages, on_new_prefix=lambda: self._warm(""))
        self.listener = Listener(models.asr, models.vad_factory(), models.eou, self.config.listener(), self.tracer,
                                 self._on_heard, turn=lambda: len(self.records))
        self._reply: Reply | None = None  # the reply being spoken (or thought of)
        self._branch: Reply | None = None  # a speculative reply, held at its gate
        self._branch_text = ""
        self._resumable: Resumable | None = None
        self._awaiting_final: deque[TurnRecord] = deque(maxlen=8)  # turns ended, transcript to come
        self._warm_task: asyncio.Task | None = None
        self._chunk_ids = itertools.count()
        self._greeting_due = bool(self.config.greeting)
        self._ended = False  # run() is ending: warm no more prompts (their work would be wasted)
        self._stop = asyncio.Event()  # the conversation cannot go on (its recognizer is lost)

    @property
    def history(self) -> list:
        return self._history.messages

    @property
    def speculation_stats(self) -> dict:
        return self.spec.as_dict()

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
            while not self._stop.is_set():
                event = await self._receive()
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
            await self._cancel_branch("session ended")
            await self._end_reply_with_session()
            await _cancel(self._warm_task)
            await self.listener.close()

    async def _receive(self):
        """The next transport event, or None once the conversation must stop."""
        receive = asyncio.ensure_future(self.transport.receive())
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([receive, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if receive.done():
            return receive.result()
        await _cancel(receive)
        return None

    async def _give_up(self, code: str, message: str) -> None:
        """The conversation cannot go on: say so (the page shows it; a phone hears an apology)."""
        self._ended = True
        await self._send(SessionError(code, message, fatal=True))
        rec = TurnRecord(index=len(self.records))
        reply = self._new_reply(rec, None, fixed_text=APOLOGY).start()
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
        elif isinstance(ev, heard.UserBargedIn):
            self.tracer.instant(Stage.TURN, Ev.BARGE_IN, turn=turn - 1)
            await self._barge_in()
        elif isinstance(ev, heard.HeardPartial):
            await self._send(PartialTranscript(ev.text, ev.stable))
            # the LLM reads the words so far while the user goes on; not once they stopped,
            # nor while a reply is on (a barge-in: its history is not settled yet), nor in
            # waterfall mode (its LLM sees nothing before the final transcript)
            if (self.listener.turns.in_speech and self.listener.state == State.USER_SPEAKING
                    and self._reply is None and self._branch is None and self.config.mode == "concurrent"):
                self._warm(ev.text)
        elif isinstance(ev, heard.PauseTranscript):
            if self.config.speculate and self.config.mode == "concurrent" and self._branch is None:
                self._start_branch(ev.text)
        elif isinstance(ev, heard.UserResumed):
            self.tracer.instant(Stage.TURN, Ev.SPEECH_RESUMED, turn=turn)
            await self._cancel_branch("user went on speaking")
        elif isinstance(ev, heard.TurnEnded):
            rec = TurnRecord(index=turn, speech_end=ev.speech_end, endpoint=ev.endpoint)
            self.records.append(rec)
            self._awaiting_final.append(rec)
            self.tracer.instant(Stage.TURN, Ev.USER_SPEECH_END, turn=rec.index, ts_ns=_ns(rec.speech_end))
            self.tracer.instant(Stage.TURN, Ev.ENDPOINT, turn=rec.index, ts_ns=_ns(rec.endpoint))
            await self._send(EndOfUserTurn(rec.index, rec.speech_end * 1000, round(ev.t_speech_end, 3)))
        elif isinstance(ev, heard.UserTranscript):
            rec = self._awaiting_final.popleft()
            rec.asr_final, rec.user_text = ev.at, ev.text
            self.tracer.instant(Stage.ASR, Ev.FINAL, turn=rec.index, text=ev.text)
            await self._send(FinalTranscript(rec.index, ev.text,
                                             tuple((w.text, round(w.start, 3), round(w.end, 3)) for w in ev.words)))
            await self._on_final(rec)
        elif isinstance(ev, heard.FalseInterruption):
            await self._resume()
        elif isinstance(ev, heard.RecognizerLost):
            log.warning("%s: recognizer lost: %s", self.session_id, ev.message)
            await self._cancel_branch("recognizer lost")
            await self._end_reply_with_session()
            await self._give_up("recognizer_lost", ev.message)
            self._stop.set()

    def _on_played(self, ev: Played) -> None:
        if self._reply is not None and ev.event == "start":
            self._reply.playout.heard.played(ev.chunk_id)
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

    # ---- replies: start, commit, cut, resume ----------------------------------------------------
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
        self._reply = self._new_reply(rec, "", fixed_text=self.config.greeting).start()

    async def _on_final(self, rec: TurnRecord) -> None:
        if not rec.user_text:
            await self._cancel_branch("empty transcript")
            return  # the listener resumes an interrupted reply, or listens again
        self._resumable = None  # the user really spoke: the interrupted reply is gone
        branch = self._branch
        if branch is not None and same_transcript(self._branch_text, rec.user_text) and branch.running:
            self._branch = None
            self.spec.committed += 1
            self.tracer.instant(Stage.SPECULATION, Ev.COMMIT, turn=rec.index, flow=rec.index + 1)
            b = branch.record
            b.index, b.speech_end, b.endpoint, b.asr_final, b.user_text = (
                rec.index, rec.speech_end, rec.endpoint, rec.asr_final, rec.user_text)
            b.speculative = True
            self.records[rec.index] = b
            self._reply = branch
            branch.commit()
            return
        await self._cancel_branch("transcript changed" if branch else "")
        if self.listener.state == State.THINKING:
            await _cancel_reply(self._reply)
            self._reply = self._new_reply(rec, rec.user_text).start()

    def _start_branch(self, transcript: str) -> None:
        rec = TurnRecord(index=len(self.records), user_text=transcript)
        self._branch = self._new_reply(rec, transcript, speculative=True).start()
        self._branch_text = transcript
        self.spec.started += 1
        self.tracer.instant(Stage.SPECULATION, Ev.START, turn=rec.index, text=transcript, flow=rec.index + 1)

    async def _cancel_branch(self, why: str) -> None:
        branch, self._branch = self._branch, None
        if branch is None:
            return
        self.spec.cancelled += 1
        self.tracer.instant(Stage.SPECULATION, Ev.CANCEL, turn=branch.record.index, reason=why)
        await branch.cancel()
        self.spec.wasted_tokens += len(branch.record.tokens)
        self.spec.wasted_tts_s += branch.tts_seconds()

    async def _barge_in(self) -> None:
        reply, self._reply = self._reply, None
        await self._cancel_branch("barge-in")
        await _cancel_reply(reply)
        await self.transport.clear()
        self.tracer.instant(Stage.TRANSPORT, Ev.CLEAR, turn=len(self.records) - 1)
        if reply is not None:
            self._keep_cut_reply(reply, "barge-in")
            self._resumable = cut_reply(reply.record.index, reply.record.user_text, reply.record.reply_text,
                                        reply.playout.heard, reply.playout.played())
        await self._send(Interrupted(reply.record.heard_text if reply else ""))

    async def _resume(self) -> None:
        """False interruption: speak the interrupted reply again from the clause that was cut."""
        cut, self._resumable = self._resumable, None
        if cut is None:
            await self.listener.reply_finished()
            return
        self.tracer.instant(Stage.TURN, Ev.RESUME, turn=cut.turn, text=cut.rest)
        self._history.forget_cut(cut)
        resumed = TurnRecord(index=cut.turn, user_text=cut.user_text)
        self._reply = self._new_reply(resumed, cut.user_text, fixed_text=cut.rest,
                                      spoken_prefix=cut.heard_before_clause).start()

    def _keep_cut_reply(self, reply: Reply, why: str) -> None:
        """The reply stopped before its end: keep what was generated and what the far end heard
        of it in the turn's record and in the context."""
        rec = reply.record
        rec.interrupted = True
        rec.reply_text = "".join(rec.tokens).strip()
        rec.heard_text = reply.playout.heard_text()
        self.tracer.instant(Stage.TURN, Ev.INTERRUPTED, turn=rec.index, heard=rec.heard_text, why=why)
        self._history.remember(rec.user_text, rec.heard_text)

    async def _end_reply_with_session(self) -> None:
        """The far end hung up (or the input ended) while a reply was on its way: the turn keeps
        the user's words and what was heard of the reply, as after a barge-in."""
        reply, self._reply = self._reply, None
        if reply is None or not reply.running:
            return
        await reply.cancel()
        self._keep_cut_reply(reply, "session ended")

    # ---- ReplyHooks ---------------------------------------------------------------------------------
    async def send(self, event: SessionEvent) -> None:
        await self._send(event)

    async def reply_audible(self, reply: Reply) -> None:
        await self.listener.reply_started()

    async def reply_finished(self, reply: Reply) -> None:
        rec = reply.record
        self._history.remember(rec.user_text, reply.spoken)
        if self._reply is reply:
            self._reply = None
        await self.listener.reply_finished()
        await self._send(BotDone(rec.index, rec.reply_text))
        await self._send(TurnLatency(rec.summary()))

    async def reply_failed(self, reply: Reply, error: BaseException) -> None:
        if self._reply is reply:
            self._reply = None
        await self.listener.reply_finished()
        await self._send(SessionError("reply_failed", str(error)))

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

        async def run() -> None:
            with self.tracer.span(Stage.LLM, Ev.WARM_CACHE, turn=len(self.records), messages=len(messages),
                                  user_words=len((user_so_far or "").split())):
                await run_in("llm-warm", warm, messages)

        self._warm_task = asyncio.create_task(run(), name="llm-warm")


async def _cancel(task: asyncio.Task | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _cancel_reply(reply: Reply | None) -> None:
    if reply is not None:
        await reply.cancel()


def _ns(t_seconds: float) -> int:
    """perf_counter seconds -> the tracer's perf_counter_ns clock."""
    return int(t_seconds * 1e9)
