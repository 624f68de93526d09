"""Speculative replies: a branch (LLM + TTS started on the transcript at a pause, audio held
back) that is committed when the final transcript matches it, or cancelled. At most one branch
lives at a time (the session enforces it); its cost is counted, because speculation is not free."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from asr.wer import normalize


def same_transcript(a: str, b: str) -> bool:
    """Equal after normalisation (case, punctuation, number spelling)."""
    return normalize(a) == normalize(b)


@dataclass
class Branch:
    transcript: str
    task: asyncio.Task
    gate: asyncio.Event  # set on commit: the held audio plays
    record: object  # the TurnRecord the branch fills in

    def tts_seconds(self) -> float:
        return float(getattr(self.record, "tts_samples", 0.0))


@dataclass
class SpeculationStats:
    started: int = 0
    committed: int = 0
    cancelled: int = 0
    wasted_tokens: int = 0
    wasted_tts_s: float = 0.0

    def as_dict(self) -> dict:
        hit = self.committed / self.started if self.started else None
        return {"started": self.started, "committed": self.committed, "cancelled": self.cancelled,
                "hit_rate": hit, "wasted_llm_tokens": self.wasted_tokens,
                "wasted_tts_s": round(self.wasted_tts_s, 2)}
