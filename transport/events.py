"""What a conversation tells its far end besides audio: typed events, one class each.

The agent sends these through `Transport.send_event`; transports react to their types (a WAV
far end waits while the bot is busy, the console prints finals) and never to strings. `to_wire()`
is the JSON object the browser page reads (see transport/web/protocol.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar


@dataclass(frozen=True)
class SessionEvent:
    type: ClassVar[str] = ""

    def to_wire(self) -> dict:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class StateChanged(SessionEvent):
    """The conversation's state (agent.conversation.turns.State values: listening, user_speaking, ...)."""

    type: ClassVar[str] = "state"
    state: str
    # a reply is on its way or playing: the far end should not hang up or speak on cue yet
    busy: bool = False


@dataclass(frozen=True)
class PartialTranscript(SessionEvent):
    type: ClassVar[str] = "partial"
    text: str
    stable: str = ""


@dataclass(frozen=True)
class EndOfUserTurn(SessionEvent):
    """The user's turn ended (`speech_end_ms`: perf_counter ms of the end of their speech)."""

    type: ClassVar[str] = "endpoint"
    turn: int
    speech_end_ms: float
    speech_end_stream_s: float


@dataclass(frozen=True)
class FinalTranscript(SessionEvent):
    type: ClassVar[str] = "final"
    turn: int
    text: str
    words: tuple[tuple[str, float, float], ...] = ()

    def to_wire(self) -> dict:
        return {"type": self.type, "turn": self.turn, "text": self.text, "words": [list(w) for w in self.words]}


@dataclass(frozen=True)
class BotText(SessionEvent):
    """Reply text so far (a token, or the whole held text once a speculative reply is committed)."""

    type: ClassVar[str] = "bot_text"
    turn: int
    text: str


@dataclass(frozen=True)
class BotDone(SessionEvent):
    type: ClassVar[str] = "bot_done"
    turn: int
    text: str


@dataclass(frozen=True)
class TurnLatency(SessionEvent):
    """The turn's stage breakdown (agent.tracing.stages), flattened into the wire object."""

    type: ClassVar[str] = "latency"
    summary: dict = field(default_factory=dict)

    def to_wire(self) -> dict:
        return {"type": self.type, **self.summary}


@dataclass(frozen=True)
class Interrupted(SessionEvent):
    type: ClassVar[str] = "interrupted"
    heard: str = ""


@dataclass(frozen=True)
class CallEnded(SessionEvent):
    """The agent ended the call (`reason`: "agent", its end_call tool or action); the far end
    hangs up, and the connection closes after this."""

    type: ClassVar[str] = "call_ended"
    reason: str = "agent"


@dataclass(frozen=True)
class SessionError(SessionEvent):
    """Something the user should know went wrong; `fatal`: the conversation cannot go on."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    fatal: bool = False
