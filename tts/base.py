"""The TTS vocabulary: audio chunks tagged with the text they speak, and the Synthesizer protocol."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    text: str  # the words this audio speaks

    @property
    def duration(self) -> float:
        return self.pcm.size / self.sample_rate


class Synthesizer(Protocol):
    name: str
    sample_rate: int

    def stream(self, text_chunks: AsyncIterator[str]) -> AsyncIterator[AudioChunk]:
        """Synthesize each text chunk as it arrives; yield audio tagged with its text."""


class SentenceSynthesizer:
    """Base for voices that synthesize one text chunk at a time with a blocking call.

    Subclasses implement `synthesize(text) -> int16 array`; synthesis runs in a worker thread.
    """

    name = "voice"
    sample_rate = 22050

    def synthesize(self, text: str) -> np.ndarray:
        raise NotImplementedError

    async def stream(self, text_chunks: AsyncIterator[str]) -> AsyncIterator[AudioChunk]:
        async for text in text_chunks:
            text = text.strip()
            if not any(ch.isalnum() for ch in text):
                continue
            pcm = await asyncio.to_thread(self.synthesize, text)
            if pcm.size:
                yield AudioChunk(pcm, self.sample_rate, text)
