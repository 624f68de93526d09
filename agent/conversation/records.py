"""What happened in each turn: the user's side, the reply's progress, and the row kept of both.

- `UserTurn`: the user's side of a turn (a frozen value the session makes; a later fact, the
  final transcript, makes a new one).
- `ReplyProgress`: the reply's own state as it runs (tokens, milestones, texts), written only
  by its `agent.conversation.reply.Reply`.
- `TurnRecord`: the row that metrics, reports and the page read, made of the two
  (`TurnRecord.of`), frozen.
- `TurnLog`: the session's rows by absolute turn number, bounded. A turn whose reply is still
  on is followed: read, its row is made from the reply as it is now; settled, it keeps the
  reply's last row.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agent.tracing.stages import breakdown


@dataclass(frozen=True)
class UserTurn:
    """The user's side of one turn (or of a greeting, a `say`: no speech), perf_counter seconds."""

    index: int
    speech_end: float = 0.0
    endpoint: float = 0.0
    asr_final: float = 0.0
    user_text: str = ""


@dataclass(eq=False)
class ReplyProgress:
    """One reply's state as it runs, perf_counter seconds (0.0: not reached)."""

    tokens: list[str] = field(default_factory=list, repr=False)
    llm_first_token: float = 0.0
    tts_first_chunk: float = 0.0
    first_audio_out: float = 0.0
    tts_samples: float = 0.0  # seconds of speech synthesized
    tts_skipped: int = 0  # text chunks the voice failed on, skipped (not heard)
    reply_text: str = ""
    heard_text: str = ""
    # why the reply failed (its LLM down, stalled or cut off; its voice or the line broken),
    # None when it did not; the user then heard an apology after the words in `heard_text`
    error: str | None = None
    interrupted: bool = False  # cut: by the user's words, or by the call's end


@dataclass(frozen=True)
class TurnRecord:
    """One turn (or a greeting) as kept, with time.perf_counter() times in seconds."""

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
    error: str | None = None  # see ReplyProgress.error
    tts_skipped: int = 0  # text chunks the voice failed on, skipped (not heard)
    tokens: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, turn: UserTurn, progress: ReplyProgress | None = None, *, speculative: bool = False) -> "TurnRecord":
        """The row of `turn` and its reply's `progress` (None: a turn with no reply yet)."""
        row = cls(turn.index, turn.speech_end, turn.endpoint, turn.asr_final, user_text=turn.user_text)
        if progress is None:
            return row
        p = progress
        return replace(row, llm_first_token=p.llm_first_token, tts_first_chunk=p.tts_first_chunk,
                       first_audio_out=p.first_audio_out, reply_text=p.reply_text, heard_text=p.heard_text,
                       interrupted=p.interrupted, speculative=speculative, tts_samples=p.tts_samples,
                       error=p.error, tts_skipped=p.tts_skipped, tokens=tuple(p.tokens))

    @property
    def voice_to_voice(self) -> float | None:
        # None without both ends: a reply not yet heard, or a greeting (no user speech before it)
        return self.first_audio_out - self.speech_end if self.first_audio_out and self.speech_end else None

    def summary(self) -> dict:
        """The turn's texts and its stage breakdown (agent.tracing.stages.breakdown)."""
        return {
            "turn": self.index, "user": self.user_text, "reply": self.reply_text,
            "heard": self.heard_text, "interrupted": self.interrupted, "speculative": self.speculative,
            **breakdown(self.speech_end, self.endpoint, self.asr_final, self.llm_first_token,
                        self.tts_first_chunk, self.first_audio_out),
            "mouth_to_ear_ms": self.mouth_to_ear_ms, "error": self.error, "tts_skipped": self.tts_skipped,
        }


class _Followed:
    """A turn whose reply is still on: `source()` makes its row as it is now; `facts` are fields
    learnt meanwhile from elsewhere (the page's mouth-to-ear), laid over it."""

    __slots__ = ("source", "facts")

    def __init__(self, source: Callable[[], TurnRecord]):
        self.source = source
        self.facts: dict = {}

    def row(self) -> TurnRecord:
        row = self.source()
        return replace(row, **self.facts) if self.facts else row


class TurnLog:
    """The session's turn rows, indexed by absolute turn number, keeping only the last `keep`
    of them (a session can last hours). `len()` is the number of turns ever started. Reading a
    turn always gives a frozen `TurnRecord`: for a followed turn, its reply's row as of now."""

    def __init__(self, keep: int = 256):
        self._recent: deque[TurnRecord | _Followed] = deque(maxlen=keep)
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
        return _row(self._recent[self._pos(i)])

    def __setitem__(self, i: int, rec: TurnRecord) -> None:
        self._recent[self._pos(i)] = rec

    def __contains__(self, i: int) -> bool:
        return self._count - len(self._recent) <= i < self._count

    def __iter__(self):
        return (_row(e) for e in list(self._recent))

    def follow(self, i: int, source: Callable[[], TurnRecord]) -> None:
        """Turn `i`'s row is `source()` (its reply's, as it runs) until `settle(i, source)`."""
        self._recent[self._pos(i)] = _Followed(source)

    def settle(self, i: int, source: Callable[[], TurnRecord]) -> bool:
        """`source` (as given to `follow`) is done: turn `i` keeps its last row, with the facts
        learnt meanwhile; True. False where turn `i` is no longer kept, or follows another source."""
        if i not in self:
            return False
        pos = self._pos(i)
        e = self._recent[pos]
        if not (isinstance(e, _Followed) and e.source == source):
            return False
        self._recent[pos] = e.row()
        return True

    def update(self, i: int, **facts) -> None:
        """A later fact about turn `i` (its row is replaced; a followed turn keeps it for its
        rows to come). Nothing where turn `i` is no longer kept."""
        if i not in self:
            return
        pos = self._pos(i)
        e = self._recent[pos]
        if isinstance(e, _Followed):
            e.facts.update(facts)
        else:
            self._recent[pos] = replace(e, **facts)


def _row(e: TurnRecord | _Followed) -> TurnRecord:
    return e.row() if isinstance(e, _Followed) else e
