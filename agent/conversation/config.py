"""What a conversation is made of: its models and its settings."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.conversation.listener import ListenerConfig
from agent.conversation.pipeline import Pipeline, pipeline_named
from agent.conversation.reply import LLM_APOLOGY, ReplyConfig
from agent.conversation.turns import TurnConfig
from agent.toolkit.voice_agent import DEFAULT_INSTRUCTIONS
from agent.workers import physical_cores
from asr.base import StreamingRecognizer
from llm.base import ChatModel
from tts.base import Synthesizer

DEFAULT_SYSTEM_PROMPT = DEFAULT_INSTRUCTIONS


@dataclass
class SessionConfig:
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    mode: str = "concurrent"  # a name in agent.conversation.pipeline.PIPELINES: "concurrent" | "waterfall"
    turns: TurnConfig = field(default_factory=TurnConfig)
    # context kept for the LLM; when it overflows, it is cut back to half in one go
    max_history_messages: int = 16
    max_tokens: int = 80
    first_chunk_words: int = 2
    playout_lead_s: float = 0.4
    piece_s: float = 0.1
    speculate: bool = True  # start ASR final + LLM + TTS at a pause, before the turn is confirmed
    # spoken when the far end's audio first arrives (a phone line or the page's microphone is
    # live); the context keeps it as the assistant's first message (what was heard of it)
    greeting: str | None = None
    max_speculations_per_turn: int = 5
    final_pad_s: float = 0.12
    # the reply speculates on a pause's transcript while the text model judges it, where there are
    # cores for both (`ListenerConfig.speculate_before_verdict`; None: decided from the cores)
    speculate_before_verdict: bool | None = None
    # the LLM's first token must come within this, and each next one within this of the one
    # before, or the reply fails (None: wait for ever). `--llm-timeout` (5 s) sets it for an LLM
    # server, which can be down or stalled; an embedded model is only ever slow
    llm_timeout_s: float | None = None
    # spoken after a reply's LLM failed (down, stalled, cut off); not kept as what it said
    llm_apology: str = LLM_APOLOGY

    def __post_init__(self):
        pipeline_named(self.mode)  # refused here, not at the first reply

    @property
    def pipeline(self) -> Pipeline:
        return pipeline_named(self.mode)

    def reply(self) -> ReplyConfig:
        return ReplyConfig(self.pipeline, self.max_tokens, self.first_chunk_words, self.playout_lead_s, self.piece_s,
                           llm_timeout_s=self.llm_timeout_s, apology=self.llm_apology)

    def listener(self) -> ListenerConfig:
        both = self.speculate_before_verdict
        return ListenerConfig(self.turns, self.max_speculations_per_turn, self.final_pad_s,
                              speculate_before_verdict=physical_cores() >= 2 if both is None else both)


@dataclass
class Models:
    asr: StreamingRecognizer
    llm: ChatModel
    tts: Synthesizer
    vad_factory: Callable[[], object]  # -> a callable scoring 16 kHz audio into 32 ms frame probs
    eou: object | None = None  # end-of-turn model: .probability(float32 16 kHz audio) -> float
