"""The conversation's replies: at most one speaking and one speculative branch held at its gate.

Commit a branch whose guess was right, cancel one that was wrong; pause the reply when the user
speaks over it, then cut it if they said words (keeping what was heard of it) or resume it from
where its audio stopped if they did not. Speculation is not free, so what it wastes is counted.

A reply answering a turn of the log is followed there while it runs (`TurnLog.follow`: the turn
reads as the reply's row of the moment) and settled once it has finished, failed, been cut or
been cancelled: the turn then keeps its last row.
"""
from __future__ import annotations

from collections.abc import Callable

from agent.conversation.history import History
from agent.conversation.records import TurnLog, UserTurn
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

    def start(self, turn: UserTurn, user_text: str | None, **kw) -> Reply:
        """A reply to `turn`; the log follows it if the turn is in the log (an apology for a
        conversation that cannot go on has no turn there)."""
        reply = self._new_reply(turn, user_text, **kw)
        if self.paused:
            reply.hold()
        self.current = reply.start()
        if turn.index in self.records:
            self.records.follow(turn.index, reply.row)
        return self.current

    def finished(self, reply: Reply) -> bool:
        """The reply played to its end, or failed: its turn keeps its row. True if the log
        keeps its turn (False: an apology as the call ends, or a turn too old to be kept)."""
        kept = self._settle(reply)
        if self.current is reply:
            self.current = None
        return kept

    def _settle(self, reply: Reply) -> bool:
        return self.records.settle(reply.turn.index, reply.row)

    # ---- speculation --------------------------------------------------------------------------
    def speculate(self, transcript: str) -> None:
        if self.branch is not None:
            return
        guess = UserTurn(index=len(self.records), user_text=transcript)  # the turn it is committed to replaces it
        self.branch = self._new_reply(guess, transcript, speculative=True).start()
        self._branch_text = transcript
        self.stats.started += 1
        self.tracer.instant(Stage.SPECULATION, Ev.START, turn=guess.index, text=transcript, flow=guess.index + 1)

    async def cancel_branch(self, why: str) -> None:
        branch, self.branch = self.branch, None
        if branch is None:
            return
        self.stats.cancelled += 1
        self.tracer.instant(Stage.SPECULATION, Ev.CANCEL, turn=branch.turn.index, reason=why)
        await branch.cancel()
        self.stats.wasted_tokens += len(branch.progress.tokens)
        self.stats.wasted_tts_s += branch.tts_seconds()

    async def answer(self, turn: UserTurn, start_new: bool) -> None:
        """`turn` has its transcript: commit the branch that guessed it, or (when `start_new`:
        the turn is still the bot's to answer) start a fresh reply."""
        if not turn.user_text:
            await self.cancel_branch("empty transcript")
            return  # the listener resumes an interrupted reply, or listens again
        branch = self.branch
        if branch is not None and same_transcript(self._branch_text, turn.user_text) and branch.running:
            self.branch = None
            self.stats.committed += 1
            self.tracer.instant(Stage.SPECULATION, Ev.COMMIT, turn=turn.index, flow=turn.index + 1)
            self.current = branch
            if self.paused:
                branch.hold()  # held at its gate, it has sent nothing
            branch.commit(turn)
            if turn.index in self.records:
                self.records.follow(turn.index, branch.row)
            return
        await self.cancel_branch("transcript changed" if branch else "")
        if start_new:
            if self.current is not None:
                await self.current.cancel()
                self._settle(self.current)
            self.start(turn, turn.user_text)

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

    async def barge_in(self) -> Reply | None:
        """Words over the bot: cut the paused reply; returns it, its progress with what was
        heard of it (nothing after the pause: the far end dropped it), or None if there was none.
        A reply that went on after a brief overlap whose words come now is paused first."""
        if not self.paused and self.current is not None:
            await self.pause()
        self.paused = False
        reply, self.current = self.current, None
        await self.cancel_branch(CUT_BY_WORDS)
        if reply is None:
            return None
        await reply.cancel()
        self._keep_cut(reply, CUT_BY_WORDS)
        return reply

    def resume(self) -> bool:
        """A false interruption: the paused reply plays on from the sample where its audio
        stopped; False if there is none left to resume."""
        self.paused = False
        reply = self.current
        if reply is None or not reply.running:
            return False
        at = reply.resume()
        self.tracer.instant(Stage.TURN, Ev.RESUME, turn=reply.turn.index, at_s=round(at, 6))
        return True

    async def end_with_session(self, why: str) -> None:
        """The far end hung up (or the input ended) while a reply was on its way: the turn keeps
        the user's words and what was heard of the reply, as after a barge-in."""
        self.paused = False  # what is said now (a goodbye, an apology) is not held
        await self.cancel_branch(why)
        reply, self.current = self.current, None
        if reply is None:
            return
        if not reply.running:
            self._settle(reply)
            return
        await reply.cancel()
        self._keep_cut(reply, why)

    def _keep_cut(self, reply: Reply, why: str) -> None:
        reply.cut()
        self._settle(reply)
        turn, heard = reply.turn, reply.progress.heard_text
        self.tracer.instant(Stage.TURN, Ev.INTERRUPTED, turn=turn.index, heard=heard, why=why)
        self.history.remember_reply(turn.user_text, *reply.history_messages(heard))
