"""The conversation's replies: at most one speaking and one speculative branch held at its gate.

Commit a branch whose guess was right, cancel one that was wrong; pause the reply when the user
speaks over it, then cut it if they said words (keeping what was heard of it) or resume it from
where its audio stopped if they did not. Speculation is not free, so what it wastes is counted.
"""
from __future__ import annotations

from collections.abc import Callable

from agent.conversation.history import History
from agent.conversation.records import TurnLog, TurnRecord
from agent.conversation.reply import Reply
from agent.conversation.speculation import SpeculationStats, same_transcript
from agent.tracing.trace import CUT_BY_WORDS, Ev, Stage
from transport.base import Transport


class Replies:
    def __init__(self, new_reply: Callable[..., Reply], history: History, records: TurnLog, transport: Transport,
                 tracer):
        self._new_reply, self.history, self.records = new_reply, history, records
        self.transport, self.tracer = transport, tracer
        self.current: Reply | None = None  # the reply being spoken (or thought of)
        self.branch: Reply | None = None  # a speculative reply, held at its gate
        self._branch_text = ""
        self.paused = False  # the user speaks over the bot: a reply started or committed now is held
        self.stats = SpeculationStats()

    def start(self, rec: TurnRecord, user_text: str | None, **kw) -> Reply:
        reply = self._new_reply(rec, user_text, **kw)
        if self.paused:
            reply.hold()
        self.current = reply.start()
        return self.current

    def finished(self, reply: Reply) -> None:
        if self.current is reply:
            self.current = None

    # ---- speculation --------------------------------------------------------------------------
    def speculate(self, transcript: str) -> None:
        if self.branch is not None:
            return
        rec = TurnRecord(index=len(self.records), user_text=transcript)
        self.branch = self._new_reply(rec, transcript, speculative=True).start()
        self._branch_text = transcript
        self.stats.started += 1
        self.tracer.instant(Stage.SPECULATION, Ev.START, turn=rec.index, text=transcript, flow=rec.index + 1)

    async def cancel_branch(self, why: str) -> None:
        branch, self.branch = self.branch, None
        if branch is None:
            return
        self.stats.cancelled += 1
        self.tracer.instant(Stage.SPECULATION, Ev.CANCEL, turn=branch.record.index, reason=why)
        await branch.cancel()
        self.stats.wasted_tokens += len(branch.record.tokens)
        self.stats.wasted_tts_s += branch.tts_seconds()

    async def answer(self, rec: TurnRecord, start_new: bool) -> None:
        """The turn `rec` has its transcript: commit the branch that guessed it, or (when
        `start_new`: the turn is still the bot's to answer) start a fresh reply."""
        if not rec.user_text:
            await self.cancel_branch("empty transcript")
            return  # the listener resumes an interrupted reply, or listens again
        branch = self.branch
        if branch is not None and same_transcript(self._branch_text, rec.user_text) and branch.running:
            self.branch = None
            self.stats.committed += 1
            self.tracer.instant(Stage.SPECULATION, Ev.COMMIT, turn=rec.index, flow=rec.index + 1)
            b = branch.record
            b.index, b.speech_end, b.endpoint, b.asr_final, b.user_text = (
                rec.index, rec.speech_end, rec.endpoint, rec.asr_final, rec.user_text)
            b.speculative = True
            self.records[rec.index] = b
            self.current = branch
            if self.paused:
                branch.hold()  # held at its gate, it has sent nothing
            branch.commit()
            return
        await self.cancel_branch("transcript changed" if branch else "")
        if start_new:
            if self.current is not None:
                await self.current.cancel()
            self.start(rec, rec.user_text)

    # ---- talked over: pause, then cut or resume ----------------------------------------------
    async def pause(self) -> bool:
        """The user speaks over the bot: its audio stops now, and the far end drops what it had
        buffered (the reply sends it again if it resumes). True if the reply had sent audio."""
        self.paused = True
        reply = self.current
        audible = reply is not None and await reply.pause()
        await self.transport.clear()  # as at every barge-in, whether or not anything was sent
        self.tracer.instant(Stage.TRANSPORT, Ev.CLEAR, turn=len(self.records) - 1)
        return audible

    async def barge_in(self) -> TurnRecord | None:
        """Words over the bot: cut the paused reply; returns its turn, with what was heard of
        it (nothing after the pause: the far end dropped it), or None if there was none."""
        self.paused = False
        reply, self.current = self.current, None
        await self.cancel_branch(CUT_BY_WORDS)
        if reply is None:
            return None
        await reply.cancel()
        self._keep_cut(reply, CUT_BY_WORDS)
        return reply.record

    def resume(self) -> bool:
        """A false interruption: the paused reply plays on from the sample where its audio
        stopped; False if there is none left to resume."""
        self.paused = False
        reply = self.current
        if reply is None or not reply.running:
            return False
        at = reply.resume()
        self.tracer.instant(Stage.TURN, Ev.RESUME, turn=reply.record.index, at_s=round(at, 6))
        return True

    async def end_with_session(self, why: str) -> None:
        """The far end hung up (or the input ended) while a reply was on its way: the turn keeps
        the user's words and what was heard of the reply, as after a barge-in."""
        self.paused = False  # what is said now (a goodbye, an apology) is not held
        await self.cancel_branch(why)
        reply, self.current = self.current, None
        if reply is None or not reply.running:
            return
        await reply.cancel()
        self._keep_cut(reply, why)

    def _keep_cut(self, reply: Reply, why: str) -> None:
        rec = reply.record
        rec.interrupted = True
        rec.reply_text = "".join(rec.tokens).strip()
        rec.heard_text = reply.playout.heard_text()
        self.tracer.instant(Stage.TURN, Ev.INTERRUPTED, turn=rec.index, heard=rec.heard_text, why=why)
        self.history.remember_reply(rec.user_text, *reply.history_messages(rec.heard_text))
