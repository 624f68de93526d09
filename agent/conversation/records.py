"""What happened in each turn: milestones, texts, and a bounded log of them."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from agent.tracing.stages import breakdown


@dataclass
class TurnRecord:
    """One user turn (or a greeting), with time.perf_counter() times in seconds."""

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
    # why the reply failed (its LLM down, stalled or cut off; its voice or the line broken),
    # None when it did not; the user then heard an apology after the words in `heard_text`
    error: str | None = None
    tts_skipped: int = 0  # text chunks the voice failed on, skipped (not heard)
    tokens: list[str] = field(default_factory=list, repr=False)

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


class TurnLog:
    """The session's turn records, indexed by absolute turn number, keeping only the last
    `keep` of them (a session can last hours). `len()` is the number of turns ever started."""

    def __init__(self, keep: int = 256):
        self._recent: deque[TurnRecord] = deque(maxlen=keep)
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
        return self._recent[self._pos(i)]

    def __setitem__(self, i: int, rec: TurnRecord) -> None:
        self._recent[self._pos(i)] = rec

    def __contains__(self, i: int) -> bool:
        return self._count - len(self._recent) <= i < self._count

    def __iter__(self):
        return iter(self._recent)
