"""The reply pipeline: LLM -> text chunker -> TTS -> paced playout, for one answer.

Stages run concurrently (`pipeline=Concurrent()`, agent/conversation/pipeline.py): LLM tokens go to the voice
at clause boundaries while the LLM still generates, and audio goes out while later clauses are
synthesized. With `Waterfall()` the same stages run strictly one after another (the baseline).
A reply is one task, its cancellation scope: cancelling it stops the LLM within a token and the
voice within a chunk. A speculative reply runs behind a gate: its audio is held until the turn
it guessed is confirmed. A reply the user speaks over is paused (its audio stops at once, its
LLM is not read) until the session cancels it or resumes it from the sample where it stopped.
Every queue is bounded.

Faults: the LLM must give its first token within `llm_timeout_s`, and each next one within
`llm_timeout_s` of the one before (a stopped server sends nothing, and a healthy one sends a
token every few tens of ms, so one bound serves both; only the time spent waiting for the
LLM counts, not the time the reply spends speaking). When the LLM of a committed reply fails
(down, stalled, cut off), the reply speaks `apology` in the same voice after the words already
sent, records the error in its progress (its turn's row) and tells the conversation
(`hooks.reply_failed`). The apology is not part of the reply: its audio is kept out of the words
heard (`heard_text`) and out of the turn's voice-to-voice. A chunk the voice fails on is skipped (tts/base.py), traced
and counted in the turn; the reply goes on.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from agent.conversation.history import Heard
from agent.conversation.pipeline import Concurrent, Pipeline
from agent.conversation.records import ReplyProgress, TurnRecord, UserTurn
from agent.conversation.tool_steps import ReplyTools
from agent.tracing.trace import Ev, Stage
from agent.workers import cancel_and_wait
from llm.base import ChatModel, Message, ToolCall, assistant_calls
from llm.tool_format import ToolCallText
from llm.tool_results import style_for
from transport.base import AudioOut, Transport
from transport.events import BotText, SessionEvent
from tts.base import AudioChunk, Synthesizer, known_text
from tts.chunking import TextChunker

log = logging.getLogger("duplex.reply")

# what the user hears after a reply's LLM failed (the words already spoken stay heard)
LLM_APOLOGY = "Sorry, I lost my train of thought. Could you say that again?"
TTS_SKIP = "chunk_skipped"  # trace event (stage tts): a chunk the voice failed on, not heard


class LLMStalled(RuntimeError):
    """The LLM gave no token within the reply's `llm_timeout_s`."""


@dataclass
class ReplyConfig:
    pipeline: Pipeline = field(default_factory=Concurrent)  # the stages at once, or one after another
    max_tokens: int = 80
    # words of the answer's first TTS chunk (see tts/chunking.py): each word waited for costs
    # one LLM token before the first audio (`duplex bench latency` re-measures it)
    first_chunk_words: int = 2
    playout_lead_s: float = 0.4  # audio sent ahead of real time; bounds the far end's buffer
    piece_s: float = 0.1  # size of each audio message
    # bound on each wait for the LLM's next token, the first one included (None: no bound)
    llm_timeout_s: float | None = None
    apology: str = LLM_APOLOGY  # spoken after an LLM failure ("": nothing is said)


class ReplyHooks(Protocol):
    """What a reply tells the conversation around it."""

    async def send(self, event: SessionEvent) -> None: ...

    async def reply_audible(self, reply: "Reply") -> None:
        """The reply's first audio is going out."""

    async def reply_finished(self, reply: "Reply") -> None:
        """The reply was played to its end (or, a speculative one, committed and played)."""

    async def reply_failed(self, reply: "Reply", error: BaseException) -> None:
        """A model failed mid-reply (an LLM server gone, a voice that raises)."""


@dataclass(eq=False)
class _Piece:
    """One audio message: its samples and words, and once sent its id, offset and play start."""

    pcm: np.ndarray
    rate: int
    text: str
    heard: bool = True  # the reply's words (False: an apology, kept out of what was heard)
    cid: int = -1
    offset_s: float = 0.0  # reply seconds before it
    sent: bool = False
    started_at: float | None = None  # perf_counter time the far end said it began playing

    @property
    def seconds(self) -> float:
        return self.pcm.size / self.rate


class Playout:
    """Sends reply audio in small pieces, at most `lead_s` ahead of the far end's playout, and records in
    `heard` which text each piece speaks, so the words the user actually heard are known.

    One sender task sends the pieces in order. `pause` stops it at once (the caller then clears
    the far end, which drops what it had buffered); `resume` plays on from the sample where the
    far end stopped: the audio from there is sent again under new ids, and the pieces the clear
    dropped leave `heard`, so what was cleared unplayed never counts as heard. The audio kept for
    that is the last `keep_s` seconds sent (the far end holds at most `lead_s` of it)."""

    def __init__(self, transport: Transport, lead_s: float, piece_s: float, new_id: Callable[[], int],
                 keep_s: float = 2.0, queue_s: float = 1.0, resume_skip_s: float = 0.5):
        self.transport, self.lead_s, self.piece_s, self.keep_s = transport, lead_s, piece_s, keep_s
        self.queue_s = queue_s
        # a resume that lands in a pause of the voice (between two sentences) skips at most this
        # much of it: the user has just waited through their own overlap, and a person who was
        # interrupted goes on with the next word
        self.resume_skip_s = resume_skip_s
        self._new_id = new_id  # chunk ids are unique for the whole session
        self.t0: float | None = None  # perf_counter time of reply second 0 (a resume moves it)
        self.sent_s = 0.0  # reply seconds sent (a resume goes back to where the far end stopped)
        self.heard = Heard()
        self._queue: deque[_Piece] = deque()  # to send, in order (a chunk's pieces at most `queue_s` behind), after a resume's
        self._recent: deque[_Piece] = deque()  # sent, with their audio, for a resume (the last keep_s)
        self._running = asyncio.Event()
        self._running.set()
        self._paused_at: float | None = None
        self._tick = asyncio.Event()  # set, then replaced, at each change: a piece queued or sent, a pause, a resume
        self._sending = asyncio.Lock()  # held while a piece is on its way to the transport
        self._sender: asyncio.Task | None = None
        self._error: BaseException | None = None  # the transport failed: every wait raises it
        self._last_ended = -1  # the latest piece the far end said it played to its end

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def play(self, chunk: AudioChunk, heard: bool = True) -> None:
        """Queue a chunk to be sent (paced, at most `lead_s` ahead of the far end); returns once
        at most `queue_s` of audio waits unsent, so the voice makes the next chunk while this
        one plays, and a chunk that takes longer to make than `lead_s` leaves no hole.
        `heard=False`: audio that is not the reply's words (an apology); kept out of `heard`."""
        self._queue.extend(_Piece(pcm, chunk.sample_rate, text, heard) for pcm, text in split_chunk(chunk, self.piece_s))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all(), name="playout")
        self._changed()
        await self._until(lambda: sum(p.seconds for p in self._queue) <= self.queue_s + 1e-9)

    async def wait_played(self) -> None:
        """Until all was sent and its time to play has come (a pause waits for the resume)."""
        while True:
            tick = self._tick
            if self._error is not None:
                raise self._error
            if self.paused or self._queue:
                await tick.wait()
                continue
            remaining = self.t0 + self.sent_s - time.perf_counter() if self.t0 is not None else 0.0
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):  # or a pause meanwhile: look again
                async with asyncio.timeout(remaining):
                    await tick.wait()

    def hold(self) -> None:
        """Stop sending (a reply that has sent nothing yet can be held before it starts)."""
        if self._running.is_set():
            self._running.clear()
            self._paused_at = time.perf_counter()
            self._changed()

    async def pause(self) -> bool:
        """Stop sending now; returns once no piece is on its way, so that a clear sent next
        drops all that was sent. True if any audio went out (there is something to clear)."""
        self.hold()
        async with self._sending:
            pass
        return self.t0 is not None

    def resume(self) -> float:
        """Play on from where the far end stopped (`paused_position`); returns that position in
        reply seconds. The piece it stopped in is sent again from that sample (its words were
        heard: it had begun), the pieces after it whole, with their words."""
        if not self.paused:
            return self.sent_s
        pos = self.paused_position()
        again, dropped = [], set()
        for p in self._recent:
            if p.offset_s + p.seconds <= pos + 1e-9:
                continue
            skip = round((pos - p.offset_s) * p.rate)
            if skip <= 0:
                again.append(_Piece(p.pcm, p.rate, p.text, p.heard))
                dropped.add(p.cid)
            else:
                again.append(_Piece(p.pcm[skip:], p.rate, "", p.heard))
        self.heard.dropped(dropped)
        self._recent = deque(p for p in self._recent if p.offset_s + p.seconds <= pos + 1e-9)
        self._queue.extendleft(reversed(again))
        self._skip_silence(self.resume_skip_s)
        if self.t0 is not None:
            self.t0 = time.perf_counter() - pos  # the clock goes on from the paused sample
        self.sent_s = pos
        self._paused_at = None
        self._running.set()
        self._changed()
        return pos

    def _skip_silence(self, most_s: float) -> None:
        """Drop up to `most_s` of silence from the front of the queue, keeping its words (the text
        of a piece dropped whole goes to the piece after it) and 20 ms before the next voice."""
        left, words = most_s, ""
        while self._queue:
            p = self._queue[0]
            start = voiced_from(p.pcm, p.rate)
            if start is None and len(self._queue) > 1 and p.seconds <= left:
                self._queue.popleft()
                left -= p.seconds
                words = f"{words} {p.text}".strip()
                continue
            voice_at = p.pcm.size if start is None else max(0, start - p.rate // 50)
            cut = max(0, min(voice_at, int(left * p.rate), p.pcm.size - 1))
            if cut or words:
                self._queue[0] = _Piece(p.pcm[cut:], p.rate, f"{words} {p.text}".strip(), p.heard)
            return

    def paused_position(self) -> float:
        """Reply seconds the far end played before it stopped. From its marks: into the last
        piece it said it began, by the time from that mark to the pause (the mark's way back
        makes this a little early, so a resume repeats a few ms rather than skip them); from
        the clock for a far end without marks."""
        if not self.transport.reports_playout:
            return self.clock()
        started = [p for p in self._recent if p.started_at is not None]
        if not started:  # none of the audio kept was begun: all of it is still to play
            return self._recent[0].offset_s if self._recent else self.sent_s
        last = started[-1]
        at = self._paused_at if self._paused_at is not None else time.perf_counter()
        return last.offset_s + min(last.seconds, max(0.0, at - last.started_at))

    def clock(self) -> float:
        """Reply seconds due to have played by now (by the pause, while paused), within what was sent."""
        if self.t0 is None:
            return 0.0
        at = self._paused_at if self._paused_at is not None else time.perf_counter()
        return max(0.0, min(at - self.t0, self.sent_s))

    def on_played(self, chunk_id: int, at: float | None = None) -> None:
        """The far end began playing piece `chunk_id` (at perf_counter time `at`, default now)."""
        self.heard.played(chunk_id)
        for p in reversed(self._recent):
            if p.cid == chunk_id:
                p.started_at = time.perf_counter() if at is None else at
                break

    def on_ended(self, chunk_id: int) -> None:
        """The far end finished playing piece `chunk_id`."""
        self._last_ended = max(self._last_ended, chunk_id)
        self._changed()

    async def wait_heard(self) -> None:
        """Until the far end has played everything sent to its end: its end mark of the last
        piece where it reports playout (ids grow, so a later piece's mark counts too), else
        the clock."""
        await self.wait_played()
        if self.transport.reports_playout and self._recent:
            last = self._recent[-1].cid
            await self._until(lambda: self._last_ended >= last)

    def played(self) -> set[int]:
        """The pieces the far end started playing (its marks), else those whose time came."""
        if self.transport.reports_playout:
            return self.heard.played_ids
        return self.heard.played_by_time(self.clock())

    def heard_text(self) -> str:
        return self.heard.text(self.played())

    def sent_text(self) -> str:
        """The reply's words sent so far: what the user hears of it unless it is cut."""
        return self.heard.text({cid for cid, _, _ in self.heard.pieces})

    async def close(self) -> None:
        await cancel_and_wait(self._sender)

    # ---- the sender ----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def _until(self, done: Callable[[], bool]) -> None:
        while True:
            tick = self._tick
            if self._error is not None:
                raise self._error
            if done():
                return
            await tick.wait()

    async def _send_all(self) -> None:
        try:
            while True:
                tick = self._tick
                if self.paused or not self._queue:
                    await tick.wait()
                    continue
                now = time.perf_counter()
                if self.t0 is None or now - self.t0 > self.sent_s:
                    # the first piece, or the far end has played all it had (the voice fell
                    # behind): it plays this piece from now, so the clock goes on from here;
                    # else the pieces would burst out to catch a clock that ran on in the
                    # silence, and the reply would count as played before its audio was
                    self.t0 = now - self.sent_s
                ahead = self.sent_s - (now - self.t0)
                if ahead > self.lead_s:
                    with contextlib.suppress(TimeoutError):  # a pause meanwhile: look again
                        async with asyncio.timeout(ahead - self.lead_s):
                            await tick.wait()
                    continue
                piece = self._queue.popleft()
                async with self._sending:  # no await between the pause check and this
                    await self._send(piece)
                self._changed()
        except Exception as e:  # noqa: BLE001 - the reply's waits raise it
            self._error = e
            self._changed()

    async def _send(self, piece: _Piece) -> None:
        piece.cid, piece.offset_s = self._new_id(), self.sent_s
        if piece.heard:
            self.heard.sent(piece.cid, piece.offset_s, piece.text)
        self._recent.append(piece)
        while self._recent and self._recent[0].offset_s + self._recent[0].seconds < self.clock() - self.keep_s:
            self._recent.popleft()
        await self.transport.send_audio(AudioOut(piece.pcm, piece.rate, piece.cid, piece.text))
        self.sent_s += piece.seconds
        piece.sent = True


SILENCE_DBFS = -45.0  # a 10 ms window of the voice this quiet (RMS) is a pause in it


def voiced_from(pcm: np.ndarray, rate: int) -> int | None:
    """The first sample of the first 10 ms window of `pcm` louder than `SILENCE_DBFS` (None: none is)."""
    n = max(1, rate // 100)
    x = pcm.astype(np.float32) / (32768.0 if np.issubdtype(pcm.dtype, np.integer) else 1.0)
    m = x.size // n
    if m == 0:
        return 0 if x.size and float(np.sqrt(np.mean(x * x))) > 10 ** (SILENCE_DBFS / 20) else None
    rms = np.sqrt(np.mean(x[:m * n].reshape(m, n) ** 2, axis=1))
    loud = np.flatnonzero(rms > 10 ** (SILENCE_DBFS / 20))
    return int(loud[0] * n) if loud.size else None


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


class Reply:
    """One answer to `messages` (or `fixed_text`, spoken as is) for the user's `turn`, keeping its
    own state in `progress`; `row()` is the turn's record as of now. A speculative reply is made
    for a provisional turn and given the real one when it is committed."""

    def __init__(self, turn: UserTurn, messages: list[Message], *, llm: ChatModel, tts: Synthesizer,
                 transport: Transport, config: ReplyConfig, tracer, new_chunk_id: Callable[[], int],
                 hooks: ReplyHooks, speculative: bool = False, fixed_text: str | None = None,
                 tools: ReplyTools | None = None, context: Callable[[], Awaitable[list[Message]]] | None = None):
        self.turn, self.messages = turn, messages
        self.progress = ReplyProgress()  # written by this reply alone (a cut: through `cut`)
        self.speculative = speculative  # started before its turn ended
        self.llm, self.tts, self.config, self.tracer, self.hooks = llm, tts, config, tracer, hooks
        self.fixed_text = fixed_text
        self.tools = tools  # the agent's tools, as this reply runs them (None: it has none)
        # the prompt, awaited when the LLM is first asked (a tool a cut reply left running ends first)
        self._context = context
        self._said_words = 0  # words sent to the voice: where a tool round falls in what was heard
        self.playout = Playout(transport, config.playout_lead_s, config.piece_s, new_chunk_id)
        self.gate = asyncio.Event()  # audio is held until it opens (a speculation's commit)
        if not speculative:
            self.gate.set()
        # paused (the user speaks over it): no audio goes out and the LLM is not read, so the
        # recognizer that decides whether it was an interruption has the cores
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self.audible = False  # its first audio went out
        self.llm_error: BaseException | None = None  # the LLM failed (vs. the voice or the line)
        self.spoken = ""  # what was said to the end
        self.task: asyncio.Task | None = None
        self._flow = config.pipeline.flow(config.max_tokens)
        self._filler: asyncio.Task | None = None  # says a filler if the answer is slow to come after a call

    @property
    def committed(self) -> bool:
        return self.gate.is_set()

    def start(self) -> "Reply":
        self.task = asyncio.create_task(self._run(), name=f"reply-{self.turn.index}")
        self.task.add_done_callback(self._forget_task)
        return self

    def _forget_task(self, task: asyncio.Task) -> None:
        # an ended task keeps its exception, whose frames refer to this reply: a cycle
        self.task = None

    def commit(self, turn: UserTurn) -> None:
        """The speculation guessed `turn` right: it is this reply's turn now, and its audio may go."""
        self.turn = turn
        if self.tools is not None:
            self.tools.turn = turn.index
        self.gate.set()

    def cut(self) -> None:
        """The reply was cut (cancelled) while it spoke: its turn keeps its text so far and the
        words the far end played of it."""
        p = self.progress
        p.interrupted = True
        p.reply_text = "".join(p.tokens).strip()
        p.heard_text = self.playout.heard_text()

    def row(self) -> TurnRecord:
        """The turn's record as of now: the user's side and this reply's progress."""
        return TurnRecord.of(self.turn, self.progress, speculative=self.speculative)

    async def cancel(self) -> None:
        await cancel_and_wait(self.task)

    @property
    def paused(self) -> bool:
        return not self._unpaused.is_set()

    def hold(self) -> None:
        """Pause a reply that has sent nothing yet (it starts or is committed while the user
        speaks over the bot)."""
        self._unpaused.clear()
        self.playout.hold()

    async def pause(self) -> bool:
        """Stop its audio now (see `Playout.pause`); True if any was sent (to clear)."""
        self._unpaused.clear()
        return await self.playout.pause()

    def resume(self) -> float:
        """Play on from the sample where the far end stopped; returns it (reply seconds)."""
        self._unpaused.set()
        return self.playout.resume()

    def _tool_results(self):
        """How this reply's model reads tool results (llm/tool_results.py); None without tools."""
        return None if self.tools is None else style_for(self.tools.policy.results, self.llm)

    @property
    def ran_tools(self) -> bool:
        return self.tools is not None and bool(self.tools.steps)

    @property
    def asks(self) -> bool:
        """What was said to the end ends asking the user something."""
        return self.spoken.rstrip(" \n\"')").endswith("?")

    @property
    def ends_call(self) -> bool:
        """A tool (end_call) asked that the call end once this reply has been heard."""
        return self.tools is not None and self.tools.ends_call

    def history_messages(self, heard: str) -> tuple[list[Message], list]:
        """What the history keeps of this reply, given the words heard (see ReplyTools)."""
        if self.tools is not None and self.tools.steps:
            return self.tools.history_messages(heard)
        return ([{"role": "assistant", "content": heard}] if heard else []), []

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def tts_seconds(self) -> float:
        return self.progress.tts_samples

    async def _run(self) -> None:
        try:
            await self._stages_or_failure()
        finally:
            await self.playout.close()

    async def _stages_or_failure(self) -> None:
        try:
            await self._stages()
        except Exception as e:  # noqa: BLE001 - reported to the client, the session survives
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                e = e.exceptions[0]  # the TaskGroup's one failing stage
            p = self.progress
            log.warning("turn %d: reply failed: %s", self.turn.index, describe(e))
            self.tracer.instant(Stage.TURN, Ev.REPLY_ERROR, turn=self.turn.index, error=describe(e)[:200])
            if not self.committed:
                return  # an uncommitted speculation: the turn's end starts a fresh reply
            p.reply_text = "".join(p.tokens).strip()
            p.error = describe(e)
            # the words sent before the failure play out (nothing clears them): they were heard
            self.spoken = self.playout.sent_text()
            p.heard_text = self.spoken
            if self.llm_error is not None and self.config.apology:
                await self._apologize()
            await self.hooks.reply_failed(self, e)

    async def _apologize(self) -> None:
        """Say the apology after what was sent, in the same voice; a failure here is only logged
        (a voice or a line that is broken cannot say it either)."""
        try:
            async with contextlib.aclosing(self.tts.stream(known_text(self.config.apology))) as chunks:
                async for chunk in chunks:
                    if chunk.error is None and chunk.pcm.size:
                        await self._play(chunk, heard=False)
            await self.playout.wait_played()
        except Exception as e:  # noqa: BLE001
            log.warning("turn %d: the apology could not be spoken: %s", self.turn.index, describe(e))

    # ---- the stages: LLM -> chunker -> voice -> line, through the pipeline's flow ------------------
    async def _stages(self) -> None:
        p = self.progress
        self.tracer.instant(Stage.LLM, Ev.REQUEST, turn=self.turn.index, flow=self.turn.index + 1)
        await self._flow.run(self._think, self._speak)
        await self.gate.wait()  # a speculative reply with no audio still waits to be committed
        p.reply_text = "".join(p.tokens).strip()
        await self.playout.wait_played()
        # a skipped chunk was not heard; a filler was, though the LLM did not write it
        self.spoken = self.playout.sent_text() if p.tts_skipped or self.ran_tools else p.reply_text
        p.heard_text = self.spoken
        self.tracer.instant(Stage.TURN, Ev.TURN_END, turn=self.turn.index)
        await self.hooks.reply_finished(self)

    async def _think(self) -> None:
        """The LLM's side: the answer, in as many tool rounds as it takes, as text for the voice."""
        try:
            await self._answer()
        finally:
            if self._filler is not None:
                self._filler.cancel()

    async def _answer(self) -> None:
        tokens = self.progress.tokens
        chunker = TextChunker(first_max_words=self.config.first_chunk_words)
        messages = self.messages
        if self._context is not None and self.fixed_text is None:
            messages = self.messages = await self._context()
        style = self._tool_results()
        offer_tools = self.tools is not None and bool(self.tools.tools)
        while True:
            before = len(tokens)
            calls = await self._generate(style.prepare(messages, offer_tools) if style else messages, chunker,
                                         offer_tools)
            if not calls:
                break
            for piece in chunker.flush():  # what it said before the calls is heard while they run
                await self._emit(piece)
            if not await self._may_run(calls, offer_tools):
                break
            results = await self.tools.run(calls, lambda: self._said_words)
            messages = [*messages, assistant_calls("".join(tokens[before:]).strip(), calls), *results]
            offer_tools = style.chains
            if tokens and not tokens[-1].endswith(" "):
                tokens.append(" ")  # the next round's words are a new sentence in reply_text
        for piece in chunker.flush():
            await self._emit(piece)
        if self.tools is not None and (self.tools.steps or self.tools.refused) and not self._said_words:
            await self._emit(self.tools.policy.no_answer)  # the user hears an answer, never silence
        self.tracer.instant(Stage.LLM, Ev.DONE, turn=self.turn.index)
        await self._flow.close()

    async def _may_run(self, calls: list[ToolCall], offer_tools: bool) -> bool:
        """Whether this round's calls run: refused past the rounds allowed or where no tools
        were offered; else once the reply is committed (a guess that is cancelled runs no
        tool), with a filler ready for when the answer is slow to come."""
        if self.tools is None or not offer_tools or not self.tools.may_run():
            if self.tools is not None:
                self.tools.refuse(calls, f"more than {self.tools.policy.max_steps} tool rounds in one reply"
                                  if offer_tools else "the answer's round offers no tools")
            return False
        await self.gate.wait()
        # the filler covers the tools' time and the model's until its answer's first words
        if self._filler is None or self._filler.done():
            self._filler = asyncio.create_task(self._say_filler(), name="filler")
        return True

    async def _say_filler(self) -> None:
        await asyncio.sleep(self.tools.policy.filler_delay_s)
        if (phrase := self.tools.filler()) is not None:
            await self._emit(phrase, is_filler=True)

    async def _emit(self, piece: str, is_filler: bool = False) -> None:
        """A piece of the answer for the voice."""
        if self._filler is not None and not is_filler:
            self._filler.cancel()  # the answer has come: no filler (one already queued is said)
        self._said_words += len(piece.split())
        await self._flow.put(piece)

    async def _generate(self, messages: list[Message], chunker: TextChunker, offer_tools: bool) -> list[ToolCall]:
        """One LLM request: its text goes to the voice, its tool calls come back."""
        p, tr, tokens = self.progress, self.tracer, self.progress.tokens
        calls: list[ToolCall] = []
        span = tr.begin(Stage.LLM, Ev.GENERATE, turn=self.turn.index, model=getattr(self.llm, "name", "llm"))
        try:
            async with contextlib.aclosing(self._tokens(messages, offer_tools)) as toks:
                async for tok in toks:
                    if isinstance(tok, ToolCall):
                        calls.append(tok)  # read on: a model may ask for several at once
                        continue
                    if not tokens:
                        p.llm_first_token = time.perf_counter()
                        tr.instant(Stage.LLM, Ev.FIRST_TOKEN, turn=self.turn.index)
                    tokens.append(tok)
                    tr.instant(Stage.LLM, Ev.TOKEN, turn=self.turn.index, text=tok)
                    if self.committed:
                        await self.hooks.send(BotText(self.turn.index, tok))
                    for piece in chunker.push(tok):
                        await self._emit(piece)
        except asyncio.CancelledError:
            tr.instant(Stage.LLM, Ev.CANCEL, turn=self.turn.index)
            raise
        finally:
            tr.end(span, tokens=len(tokens), tool_calls=len(calls))
        return calls

    async def _tokens(self, messages: list[Message], offer_tools: bool) -> AsyncIterator[str | ToolCall]:
        """The LLM's tokens and tool calls for one request (or the fixed text's words), each wait
        for the LLM bounded by `llm_timeout_s`; paused, the reply reads nothing."""
        if self.fixed_text is not None:
            for word in self.fixed_text.split(" "):
                yield word + " "
            return
        cfg = self.config
        offer = {"tools": self.tools.specs()} if offer_tools else {}
        # a round offered no tools may still write one's JSON (it read of calls): never said
        calls = ToolCallText() if self.tools is not None and not offer_tools else None
        # a paused reply gives an embedded model back (its one thread and lock serve every
        # conversation) and, resumed, continues its text where it stopped
        gives_back = getattr(self.llm, "continues_text", False)
        said = ""  # this request's text so far: what a continuation starts from
        n = 0
        toks = self.llm.stream(messages, cfg.max_tokens, **offer)
        try:
            it = aiter(toks)
            while True:
                if gives_back and self.paused:
                    await toks.aclose()
                    self.tracer.instant(Stage.LLM, Ev.YIELDED, turn=self.turn.index, tokens=n)
                    await self._unpaused.wait()
                    toks = self.llm.stream(messages, max(1, cfg.max_tokens - n), prefix=said, **offer)
                    it = aiter(toks)
                await self._unpaused.wait()  # not part of the LLM's time: outside its bound
                limit = cfg.llm_timeout_s  # read at each wait: it may be changed mid-reply
                try:  # only the wait for the LLM is bounded, not what the reply does between tokens
                    async with asyncio.timeout(limit) as deadline:
                        tok = await anext(it)
                except StopAsyncIteration:
                    break
                except Exception as e:
                    if not deadline.expired():
                        self.llm_error = e
                        raise
                    # the wait was cancelled inside the stream, which closed it (its connection)
                    self.llm_error = LLMStalled(
                        f"the LLM gave no first token within {limit:.1f} s" if not n else
                        f"the LLM stopped: no token for {limit:.1f} s after {n} tokens")
                    raise self.llm_error from None
                n += 1
                if isinstance(tok, str):
                    said += tok
                if calls is None or not isinstance(tok, str):
                    yield tok
                else:
                    for item in calls.push(tok):
                        yield item
        finally:
            await toks.aclose()
        for item in calls.flush() if calls is not None else ():
            yield item

    async def _texts(self) -> AsyncIterator[str]:
        async for piece in self._flow.pieces():
            self.tracer.instant(Stage.TTS, Ev.REQUEST, turn=self.turn.index, text=piece, flow=self.turn.index + 1)
            yield piece

    async def _speak(self) -> None:
        """The voice's side: the flow's text as audio, to the line."""
        p, tr = self.progress, self.tracer
        try:
            async with contextlib.aclosing(self.tts.stream(self._texts())) as chunks:
                async for chunk in chunks:
                    if chunk.error is not None:  # the voice failed on it (and logged it): skip
                        p.tts_skipped += 1
                        tr.instant(Stage.TTS, TTS_SKIP, turn=self.turn.index, text=chunk.text[:200],
                                   error=chunk.error[:200])
                        continue
                    if not p.tts_first_chunk:
                        p.tts_first_chunk = time.perf_counter()
                        self._flow.voiced()
                        tr.instant(Stage.TTS, Ev.FIRST_CHUNK, turn=self.turn.index)
                    p.tts_samples += chunk.pcm.size / chunk.sample_rate
                    tr.instant(Stage.TTS, Ev.CHUNK, turn=self.turn.index, samples=int(chunk.pcm.size),
                               sample_rate=chunk.sample_rate, text=chunk.text)
                    await self._flow.audio(chunk, self._play)
        except asyncio.CancelledError:
            tr.instant(Stage.TTS, Ev.CANCEL, turn=self.turn.index)
            raise
        finally:
            self._flow.voiced()
        tr.instant(Stage.TTS, Ev.DONE, turn=self.turn.index)
        await self._flow.finish(self._play)

    async def _play(self, chunk: AudioChunk, heard: bool = True) -> None:
        """`heard=False`: the apology, which is not the reply's first audio (its voice-to-voice)."""
        p = self.progress
        if not self.committed:
            await self.gate.wait()  # speculation: synthesized, but held until the turn is confirmed
            await self.hooks.send(BotText(self.turn.index, "".join(p.tokens)))
        if heard and not p.first_audio_out:
            p.first_audio_out = time.perf_counter()
            self.tracer.instant(Stage.TRANSPORT, Ev.SEND_AUDIO, turn=self.turn.index, flow=self.turn.index + 1)
        if not self.audible:
            self.audible = True
            await self.hooks.reply_audible(self)
        await self.playout.play(chunk, heard)


def describe(e: BaseException) -> str:
    """An error as one line that is never empty."""
    return str(e) or type(e).__name__
