"""One conversation: the wiring of a listener, the reply pipeline and the history.

transport audio -> `Listener` (VAD, turns, recognizer) -> turn events -> here: start, commit or
cancel a `Reply` (LLM -> TTS -> playout), pause it the moment the user speaks over it, then cut
it (words: a barge-in) or resume it where its audio stopped (no words: a false interruption),
and keep the `History`. The parts are in their own modules; this one decides.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import logging
import time
import weakref
from collections import deque

from agent.conversation import listener as heard
from agent.conversation.echo import is_echo
from agent.conversation.history import History
from agent.conversation.config import DEFAULT_SYSTEM_PROMPT, Models, SessionConfig  # noqa: F401 - the session's API
from agent.conversation.listener import Listener
from agent.conversation.records import TurnLog, TurnRecord, UserTurn
from agent.conversation.replies import Replies
from agent.conversation.reply import Reply
from agent.conversation.session_events import (
    BargeIn, DtmfReceived, EventBus, ReplyFinished, ReplyStarted, SessionEnded, UserTurnFinal)
from agent.conversation.tool_steps import ReplyTools
from agent.toolkit.voice_agent import Agent
from agent.conversation.weak import weak_async, weak_call
from agent.tracing.trace import Ev, NullTracer, Stage, Tracer
from agent.conversation.turns import State
from agent.workers import cancel_and_wait, run_in
from asr.base import RecognizerUnavailable
from llm.base import ReadAheadStop
from llm.tool_results import style_for
from transport.base import AudioIn, ClientEvent, Played, Transport
from transport.events import (
    BotDone, CallEnded, EndOfUserTurn, FinalTranscript, Interrupted, PartialTranscript, SessionError,
    SessionEvent, StateChanged, TurnLatency)

log = logging.getLogger("duplex.session")

# said on a line whose recognizer has no room: a phone has no screen to show the error
APOLOGY = "Sorry, I can't take your call right now. Please try again later."
# the longest the call waits, after the goodbye was sent, for the far end to say it was played
END_CALL_WAIT_S = 10.0


class Session:
    """One conversation. `agent` (agent.toolkit.voice_agent.Agent) gives its instructions, tools, greeting
    and hooks; without one, `config.system_prompt` and `config.greeting` make the default agent.
    Programs follow it with `on(EventType, handler)` (agent.conversation.session_events) and act on it with
    `say`, `generate_reply` and `end_call`."""

    def __init__(self, models: Models, transport: Transport, config: SessionConfig | None = None,
                 tracer=None, session_id: str = "s0", agent: Agent | None = None):
        self.models, self.transport = models, transport
        self.config = config or SessionConfig()
        self.agent = agent if agent is not None else Agent(self.config.system_prompt, greeting=self.config.greeting)
        self.events = EventBus()
        self.tools = {t.name: t for t in self.agent.tools}  # the MCP servers' join them as the call begins
        self.tracer: Tracer = tracer if tracer is not None else NullTracer(session_id)
        self.session_id = session_id
        self.records = TurnLog()
        # the parts call back through weak references: no cycle keeps a finished call alive
        self._history = History(self.config.max_history_messages, on_new_prefix=weak_call(self._warm_prefix))
        self.listener = Listener(models.asr, models.vad_factory(), models.eou, self.config.listener(), self.tracer,
                                 weak_async(self._on_heard), turn=self.records.__len__, echo=weak_call(self._is_echo))
        self.replies = Replies(weak_call(self._new_reply), self._history, self.records, transport, self.tracer)
        self._awaiting_final: deque[UserTurn] = deque(maxlen=8)  # turns ended, transcript to come
        self._warm_task: asyncio.Task | None = None
        self._warm_stop = ReadAheadStop()  # the current warm's
        self._chunk_ids = itertools.count()
        self._greeting_due = bool(self.agent.greeting)
        self._floor = asyncio.Event()  # set, then replaced, whenever the state or the reply changes
        self._ending: Reply | None = None  # a reply that ends the call once it has been heard
        self._end_task: asyncio.Task | None = None
        self._ended = False  # run() is ending: warm no more prompts (their work would be wasted)
        self._stop = asyncio.Event()  # the conversation cannot go on (its recognizer is lost)

    @property
    def history(self) -> list:
        return self._history.messages

    @property
    def speculation_stats(self) -> dict:
        return self.replies.stats.as_dict()

    def on(self, kind: type, handler=None):
        """Subscribe to the session's events of type `kind` (agent.conversation.session_events); a decorator
        without `handler`."""
        return self.events.on(kind, handler)

    # ---- actions --------------------------------------------------------------------------------
    async def say(self, text: str) -> TurnRecord:
        """Speak `text` as a reply of its own once the floor is free (no reply playing, the user
        not speaking); returns its turn once it has played or was cut. Kept in the history."""
        return await self._bot_turn(fixed_text=text)

    async def generate_reply(self, instructions: str | None = None, user_text: str | None = None) -> TurnRecord:
        """Have the LLM reply now, with `instructions` added to the agent's for this reply only
        (and `user_text` as if the user had said it), once the floor is free."""
        return await self._bot_turn(user_text=user_text, instructions=instructions)

    def end_call(self) -> None:
        """End the call once what is playing now has been heard (at once if nothing plays)."""
        reply = self.replies.current
        if reply is not None and reply.running:
            self._ending = reply
        elif self._end_task is None:
            self._end_task = asyncio.create_task(self._end_call_after(None), name="end-call")

    async def _bot_turn(self, **kw) -> TurnRecord:
        while self.replies.current is not None or self.listener.state != State.LISTENING:
            if self._stop.is_set() or self._ended:
                raise RuntimeError("the conversation has ended")
            await self._floor.wait()
        if not await self.listener.bot_initiated():
            raise RuntimeError("the user began to speak")
        user_text = kw.pop("user_text", None)
        turn = UserTurn(index=len(self.records), endpoint=time.perf_counter(), user_text=user_text or "")
        self.records.append(TurnRecord.of(turn))
        reply = self.replies.start(turn, user_text if user_text else None, **kw)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(reply.task)
        return self.records[turn.index] if turn.index in self.records else reply.row()

    def _floor_changed(self) -> None:
        self._floor.set()
        self._floor = asyncio.Event()

    # ---- main loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self.listener.open()
        except RecognizerUnavailable as e:
            log.warning("%s: no recognizer: %s", self.session_id, e)
            await self._give_up("no_recognizer", str(e))
            return
        async with contextlib.AsyncExitStack() as stack:
            await self._connect_mcp(stack)
            await self._converse()

    async def _connect_mcp(self, stack: contextlib.AsyncExitStack) -> None:
        """The agent's MCP servers, connected for this call: their tools join the agent's. A
        server that cannot be reached is left out (logged); the conversation goes on."""
        for server in self.agent.mcp_servers:
            try:
                for tool in await server.connect(stack):
                    if tool.name in self.tools:
                        log.warning("%s: MCP tool %s shadows a tool of that name: left out", self.session_id, tool.name)
                        continue
                    self.tools[tool.name] = tool
            except Exception as e:  # noqa: BLE001
                log.error("%s: MCP server %s unavailable: %s", self.session_id, server, e)

    async def _converse(self) -> None:
        self._warm(None)  # the system prompt, before the first turn needs it
        try:
            await self._agent_hook(self.agent.on_enter(self))
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
            self._floor_changed()
            cut = self.replies.current
            await self.replies.end_with_session("session ended")
            if cut is not None and cut.progress.interrupted:
                self.events.emit(ReplyFinished(cut.turn.index, cut.progress.heard_text, interrupted=True))
            self._warm_stop.set()  # the model's thread is not kept reading for no one
            await cancel_and_wait(self._warm_task, self._end_task)
            await self.listener.close()
            await self._agent_hook(self.agent.on_exit(self))
            self.events.emit(SessionEnded("ended", tuple(self.records)))
            await self.events.close()

    async def _agent_hook(self, call) -> None:
        try:
            await call
        except Exception:  # noqa: BLE001 - the integrator's bug does not end the call
            log.exception("%s: agent hook failed", self.session_id)

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
        # a turn of its own, not kept in the records (the conversation is over)
        reply = self.replies.start(UserTurn(index=len(self.records)), None, fixed_text=spoken)
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
            self._floor_changed()
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
            cut = await self.replies.barge_in()
            if cut is not None and self._ending is cut:
                self._ending = None  # the goodbye was cut: the call goes on
            heard_text = cut.progress.heard_text if cut is not None else ""
            await self._send(Interrupted(heard_text))
            if cut is not None:
                self.events.emit(BargeIn(cut.turn.index, heard_text))
                self.events.emit(ReplyFinished(cut.turn.index, heard_text, interrupted=True))
        elif isinstance(ev, heard.HeardPartial):
            await self._send(PartialTranscript(ev.text, ev.stable))
            # the LLM reads the words so far while the user goes on; not once they stopped,
            # nor while a reply is on (a barge-in: its history is not settled yet), nor where the
            # pipeline does not read ahead (the waterfall's LLM sees nothing before the final)
            if (self.listener.turns.in_speech and self.listener.state == State.USER_SPEAKING
                    and self.replies.current is None and self.replies.branch is None
                    and self.config.pipeline.reads_ahead):
                self._warm(ev.text)
        elif isinstance(ev, heard.PauseTranscript):
            if self.config.speculate and self.config.pipeline.speculates:
                self.replies.speculate(ev.text)
        elif isinstance(ev, heard.UserStopped):
            self._warm_stop.set()  # the decode of their words needs the cores more than the read-ahead
        elif isinstance(ev, heard.UserResumed):
            self.tracer.instant(Stage.TURN, Ev.SPEECH_RESUMED, turn=turn)
            await self.replies.cancel_branch("user went on speaking")
        elif isinstance(ev, heard.TurnEnded):
            ended = UserTurn(index=turn, speech_end=ev.speech_end, endpoint=ev.endpoint)
            self.records.append(TurnRecord.of(ended))  # a turn with no reply (yet)
            self._awaiting_final.append(ended)
            self.tracer.instant(Stage.TURN, Ev.USER_SPEECH_END, turn=ended.index, ts_ns=_ns(ended.speech_end))
            self.tracer.instant(Stage.TURN, Ev.ENDPOINT, turn=ended.index, ts_ns=_ns(ended.endpoint))
            await self._send(EndOfUserTurn(ended.index, ended.speech_end * 1000, round(ev.t_speech_end, 3)))
        elif isinstance(ev, heard.UserTranscript):
            if not self._awaiting_final:
                log.error("%s: a transcript with no turn waiting for it", self.session_id)
                return
            final = dataclasses.replace(self._awaiting_final.popleft(), asr_final=ev.at, user_text=ev.text)
            self.records.update(final.index, asr_final=final.asr_final, user_text=final.user_text)
            self.tracer.instant(Stage.ASR, Ev.FINAL, turn=final.index, text=ev.text)
            if ev.text:
                self.events.emit(UserTurnFinal(final.index, ev.text))
                await self._agent_hook(self.agent.on_user_turn(self, ev.text))
            await self._send(FinalTranscript(final.index, ev.text,
                                             tuple((w.text, round(w.start, 3), round(w.end, 3)) for w in ev.words)))
            # the turn is the bot's to answer; or the user speaks over its thinking (a new reply
            # starts held, and plays if that proves no interruption)
            await self.replies.answer(final, start_new=self.listener.state in (State.THINKING, State.INTERRUPTED))
        elif isinstance(ev, heard.FalseInterruption):
            if not self.replies.resume():
                await self.listener.reply_finished()
        elif isinstance(ev, heard.RecognizerLost):
            log.warning("%s: recognizer lost: %s", self.session_id, ev.message)
            await self.replies.end_with_session("recognizer lost")
            await self._give_up("recognizer_lost", ev.message)
            self._stop.set()

    def _on_played(self, ev: Played) -> None:
        for reply in {self.replies.current, self._ending} - {None}:
            if ev.event == "start":
                reply.playout.on_played(ev.chunk_id, ev.server_time)
            else:
                reply.playout.on_ended(ev.chunk_id)
        ts = _ns(ev.server_time) if ev.server_time is not None else None
        self.tracer.instant(Stage.CLIENT, Ev.PLAYOUT_START if ev.event == "start" else Ev.PLAYOUT_END,
                            turn=len(self.records) - 1, ts_ns=ts, chunk=ev.chunk_id)

    def _on_client_event(self, ev: ClientEvent) -> None:
        if ev.kind == "dtmf" and isinstance(ev.data.get("digit"), str):
            self.events.emit(DtmfReceived(ev.data["digit"]))
        if ev.kind == "metrics":
            turn, m2e = ev.data.get("turn"), ev.data.get("mouth_to_ear_ms")
            if isinstance(turn, int) and turn in self.records and isinstance(m2e, (int, float)):
                self.records.update(turn, mouth_to_ear_ms=round(float(m2e), 1))
                self.tracer.instant(Stage.CLIENT, Ev.MOUTH_TO_EAR, turn=turn, ms=float(m2e))
            return
        self.tracer.instant(Stage.CLIENT, ev.kind, **{k: v for k, v in ev.data.items() if isinstance(v, (int, float, str))})

    # ---- replies ----------------------------------------------------------------------------------
    def _new_reply(self, turn: UserTurn, user_text: str | None, instructions: str | None = None, **kw) -> Reply:
        system = f"{self.agent.instructions}\n{instructions}" if instructions else self.agent.instructions
        examples = self.agent.example_messages()
        messages = self._history.prompt(system, user_text, examples)
        tools = None
        if self.tools and kw.get("fixed_text") is None:
            tools = ReplyTools(self.tools, self.agent.tool_policy, self.tracer, turn.index, self.events.emit,
                               session=weakref.proxy(self))
        return Reply(turn, messages, llm=self.models.llm, tts=self.models.tts, transport=self.transport,
                     config=self.config.reply(), tracer=self.tracer, new_chunk_id=self._chunk_ids.__next__,
                     hooks=weakref.proxy(self), tools=tools,
                     context=functools.partial(self._history.settled_prompt, system, user_text, examples), **kw)

    async def _greet(self) -> None:
        """Speak the greeting as a reply of its own: a turn with no user words."""
        self._greeting_due = False
        turn = UserTurn(index=len(self.records), endpoint=time.perf_counter())
        if not await self.listener.bot_initiated():
            return  # the user spoke first
        self.records.append(TurnRecord.of(turn))
        self.tracer.instant(Stage.TURN, Ev.GREETING, turn=turn.index, text=self.agent.greeting)
        self.replies.start(turn, "", fixed_text=self.agent.greeting)

    # ---- ReplyHooks ---------------------------------------------------------------------------------
    async def send(self, event: SessionEvent) -> None:
        await self._send(event)

    async def reply_audible(self, reply: Reply) -> None:
        self.events.emit(ReplyStarted(reply.turn.index, reply.speculative))
        await self.listener.reply_started()

    def _is_echo(self, text: str) -> bool:
        """`text`, heard while a reply is on, is the bot's own voice come back. Once it has
        ended, nothing is: a user's answer often repeats a word of the question."""
        reply = self.replies.current
        return reply is not None and is_echo(text, reply.playout.sent_text())

    async def reply_finished(self, reply: Reply) -> None:
        self._history.remember_reply(reply.turn.user_text, *reply.history_messages(reply.spoken))
        kept = self.replies.finished(reply)
        if reply.ends_call or self._ending is reply:
            self._ending = reply
            self._end_task = asyncio.create_task(self._end_call_after(reply), name="end-call")
        await self.listener.reply_finished(asked=reply.asks)
        self._floor_changed()
        rec = self._turn_row(reply, kept)
        await self._send(BotDone(rec.index, rec.reply_text))
        await self._send(TurnLatency(self._turn_row(reply, kept).summary()))
        self.events.emit(ReplyFinished(rec.index, reply.spoken, interrupted=False))

    def _turn_row(self, reply: Reply, kept: bool) -> TurnRecord:
        """A finished reply's turn as the records keep it (with what the page reported since),
        or the reply's own row where they do not keep it (`kept`: Replies.finished)."""
        i = reply.turn.index
        return self.records[i] if kept and i in self.records else reply.row()

    async def _end_call_after(self, reply: Reply | None) -> None:
        """The call ends once the far end has played the goodbye to its end (its last piece's
        end mark; by the clock where it sends none), or after END_CALL_WAIT_S without it."""
        if reply is not None:
            try:
                async with asyncio.timeout(END_CALL_WAIT_S):
                    await reply.playout.wait_heard()
            except TimeoutError:
                log.warning("%s: the goodbye's end was not reported played within %.0f s: ending the call",
                            self.session_id, END_CALL_WAIT_S)
            except Exception as e:  # noqa: BLE001 - the line failed: the call is over anyway
                log.warning("%s: the goodbye could not be played: %s", self.session_id, e)
            if self._ending is not reply:
                return  # the user spoke over the goodbye and was answered: the call goes on
        self.tracer.instant(Stage.TURN, Ev.CALL_END, turn=len(self.records) - 1)
        self._ended = True
        await self._send(CallEnded("agent"))
        self._stop.set()

    async def reply_failed(self, reply: Reply, error: BaseException) -> None:
        """A committed reply failed (its LLM down, stalled or cut off; its voice or the line
        broken). The reply has recorded the error in its turn and, for an LLM failure, spoken
        its apology. The history keeps what was heard of the answer, never the apology (the LLM
        did not say it); when nothing was heard the exchange is not kept at all: the user was
        asked to say it again, and the roles still alternate for strict chat templates. The
        conversation goes on: the page is told (not fatal), and the next turn asks the LLM anew."""
        if reply.spoken or reply.ran_tools:
            self._history.remember_reply(reply.turn.user_text, *reply.history_messages(reply.spoken))
        kept = self.replies.finished(reply)
        await self.listener.reply_finished()
        self._floor_changed()
        rec = self._turn_row(reply, kept)
        self.events.emit(ReplyFinished(rec.index, reply.spoken, interrupted=False, error=rec.error))
        await self._send(SessionError("reply_failed", rec.error))
        await self._send(TurnLatency(self._turn_row(reply, kept).summary()))

    # ---- prompt warming -----------------------------------------------------------------------------
    def _warm_prefix(self) -> None:
        self._warm("")

    def _warm(self, user_so_far: str | None) -> None:
        """Have the LLM evaluate a prompt prefix now, while the user speaks, instead of in the
        next turn's time to first token: a new prefix (the session's start, or the history just
        cut), or the user's words so far (a partial transcript; the final prompt shares every
        token up to the words that changed)."""
        warm = getattr(self.models.llm, "warm", None)
        if warm is None or self._ended or (self._warm_task is not None and not self._warm_task.done()):
            return
        messages = self._history.prompt(self.agent.instructions, user_so_far, self.agent.example_messages())
        if self.tools:  # the prompt as the reply will give it (llm/tool_results.py)
            messages = style_for(self.agent.tool_policy.results, self.models.llm).prepare(messages)
        self._warm_stop = stop = ReadAheadStop()
        # a warmer written before `stop` existed reads ahead to the end, as it always did
        params = inspect.signature(warm).parameters
        args = (messages, stop) if "stop" in params else (messages,)
        if self.tools and "tools" in params:  # the tools are part of the prompt's prefix
            warm = functools.partial(warm, tools=[t.spec() for t in self.tools.values()])

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
