"""The conversation as the LLM sees it: what was said and what the user actually heard.

Pure code, no models, no I/O, no clocks of its own.
- `Heard`: the pieces of one reply as they were sent (text per piece, clause boundaries) and
  which of them the far end played (its marks, or their time having come): the words heard.
- `History`: the context messages, cut back in one go when too long (so the LLM's cached
  prompt prefix stays valid for several turns), with the exchange of a cut reply kept as heard.
- `cut_reply`: where a reply was cut, so that a false interruption can resume it from there.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llm.base import Message


class Heard:
    """One reply's audio pieces (chunk id, offset in the reply, text) and what was played."""

    def __init__(self) -> None:
        self.pieces: list[tuple[int, float, str]] = []  # (chunk_id, offset_s, text)
        self.clauses: list[tuple[int, str]] = []  # (first chunk_id, text) of each TTS chunk
        self.played_ids: set[int] = set()

    def sent(self, chunk_id: int, offset_s: float, text: str, clause: str | None = None) -> None:
        """A piece went out; `clause`: the TTS chunk's text, on the chunk's first piece."""
        if clause is not None:
            self.clauses.append((chunk_id, clause))
        self.pieces.append((chunk_id, offset_s, text))

    def played(self, chunk_id: int) -> None:
        self.played_ids.add(chunk_id)

    def played_by_time(self, elapsed_s: float) -> set[int]:
        """The pieces whose time has come, for a far end that reports no marks."""
        return {cid for cid, off, _ in self.pieces if off <= elapsed_s}

    def text(self, played: set[int]) -> str:
        return " ".join(t for cid, _, t in self.pieces if cid in played and t).strip()

    def text_before_clause(self, k: int, played: set[int]) -> str:
        limit = self.clauses[k][0] if k < len(self.clauses) else 1 << 62
        return " ".join(t for cid, _, t in self.pieces if cid < limit and cid in played and t).strip()

    def interrupted_clause(self, played: set[int]) -> int:
        """Index of the clause that was playing, or next to play, when the reply was cut."""
        started = [i for i, (cid, _) in enumerate(self.clauses) if cid in played]
        return started[-1] if started else 0


@dataclass(frozen=True)
class Resumable:
    """A cut reply that a false interruption may speak again from the cut clause."""

    turn: int
    user_text: str
    heard: str  # what the user heard of it (kept in the history at the cut)
    heard_before_clause: str  # heard text before the cut clause: the resumed reply follows it
    rest: str  # the reply's text from the cut clause on


def cut_reply(turn: int, user_text: str, reply_text: str, heard: Heard, played: set[int]) -> Resumable | None:
    """The resume point of a reply cut off with `played` pieces heard; None if nothing was sent."""
    if not heard.clauses:
        return None
    k = heard.interrupted_clause(played)
    start = reply_text.find(heard.clauses[k][1])
    rest = reply_text[start:] if start >= 0 else " ".join(t for _, t in heard.clauses[k:])
    return Resumable(turn, user_text, heard.text(played), heard.text_before_clause(k, played), rest)


@dataclass
class History:
    """The context after the system prompt. `on_new_prefix` is called whenever the prompt's
    prefix changed in a way the LLM could evaluate ahead of time (a turn was stored)."""

    max_messages: int = 16
    messages: list[Message] = field(default_factory=list)
    on_new_prefix: Callable[[], None] | None = None

    def prompt(self, system: str, user_text: str | None) -> list[Message]:
        out: list[Message] = [{"role": "system", "content": system}, *self.messages]
        if user_text is not None:
            out.append({"role": "user", "content": user_text})
        return out

    def remember(self, user: str, assistant: str) -> None:
        """Store one exchange: the user's words (none before a greeting) and what was heard."""
        if user:
            self.messages.append({"role": "user", "content": user})
        if assistant:
            self.messages.append({"role": "assistant", "content": assistant})
        if len(self.messages) > self.max_messages:
            keep = self.max_messages // 2
            del self.messages[:len(self.messages) - keep]
            if self.messages and self.messages[0]["role"] == "assistant":
                del self.messages[0]  # never start the context with an answer
        if self.on_new_prefix is not None:
            self.on_new_prefix()

    def forget_cut(self, cut: Resumable) -> None:
        """Drop the truncated exchange stored at a cut; the resumed reply stores it whole."""
        if self.messages[-1:] == [{"role": "assistant", "content": cut.heard}]:
            self.messages.pop()
        if self.messages[-1:] == [{"role": "user", "content": cut.user_text}]:
            self.messages.pop()
