"""The TTS vocabulary: audio chunks tagged with the text they speak, and the Synthesizer protocol."""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tts.chunking import ends_sentence
from tts.joins import trim_join


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

    Subclasses implement `synthesize(text) -> int16 array`; synthesis runs on the voice's own
    bounded pool (never asyncio's default executor, which an abandoned call elsewhere can starve).
    """

    name = "voice"
    sample_rate = 22050
    _executor: ThreadPoolExecutor | None = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:  # shared by every conversation this voice speaks for
            self._executor = ThreadPoolExecutor(min(2, os.cpu_count() or 1), thread_name_prefix=f"tts-{self.name}")
        return self._executor

    def synthesize(self, text: str) -> np.ndarray:
        raise NotImplementedError

    async def stream(self, text_chunks: AsyncIterator[str]) -> AsyncIterator[AudioChunk]:
        continues = False  # the previous chunk stopped inside a sentence
        async for text in text_chunks:
            text = text.strip()
            if not any(ch.isalnum() for ch in text):
                continue
            # trimmed so there is no hole where a sentence was cut; both in the worker thread
            pcm = await asyncio.get_running_loop().run_in_executor(
                self._pool(), lambda t=text, c=continues: trim_join(self.synthesize(t), self.sample_rate, t, c))
            continues = not ends_sentence(text)
            if pcm.size:
                yield AudioChunk(pcm, self.sample_rate, text)
