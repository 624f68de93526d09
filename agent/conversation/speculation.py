"""Speculation's vocabulary: when a final transcript confirms a guess, and what guesses cost.
(The branch itself is a speculative `agent.conversation.reply.Reply`, held by `agent.conversation.replies.Replies`.)"""
from __future__ import annotations

from dataclasses import dataclass

from asr.wer import normalize


def same_transcript(a: str, b: str) -> bool:
    """Equal after normalisation (case, punctuation, number spelling)."""
    return normalize(a) == normalize(b)


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
