"""The TTS vocabulary: audio chunks tagged with the text they speak, and the Synthesizer protocol."""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tts.chunking import ends_sentence, has_words
from tts.joins import trim_join

log = logging.getLogger("duplex.tts")


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    text: str  # the words this audio speaks
    # the voice failed on `text` (pcm is then empty): the chunk is skipped, the answer goes on
    error: str | None = None

    @property
    def duration(self) -> float:
        return self.pcm.size / self.sample_rate


async def known_text(*parts: str) -> AsyncIterator[str]:
    """Text already known in full, as the chunk stream `Synthesizer.stream` reads."""
    for part in parts:
        yield part


class Synthesizer(Protocol):
    name: str
    sample_rate: int

    def stream(self, text_chunks: AsyncIterator[str]) -> AsyncIterator[AudioChunk]:
        """Synthesize each text chunk as it arrives; yield audio tagged with its text (or, for a
        chunk the voice failed on, no audio and the error: see SentenceSynthesizer)."""


class SentenceSynthesizer:
    """Base for voices that synthesize one text chunk at a time with a blocking call.

    Subclasses implement `synthesize(text) -> int16 array`; synthesis runs on the voice's own
    bounded pool (never asyncio's default executor, which an abandoned call elsewhere can starve).

    A chunk the voice fails on (Piper given a lone surrogate, a command voice given a NUL byte,
    a voice program that exits with an error) is skipped: logged with its text, and yielded as
    an empty chunk carrying the error (the reply traces it); the next chunks are spoken.
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
            if not has_words(text):
                continue
            # trimmed so there is no hole where a sentence was cut; both in the worker thread
            try:
                pcm = await asyncio.get_running_loop().run_in_executor(
                    self._pool(), lambda t=text, c=continues: trim_join(self.synthesize(t), self.sample_rate, t, c))
            except Exception as e:  # noqa: BLE001 - one chunk lost, not the answer
                error = f"{type(e).__name__}: {e}"
                log.warning("%s could not speak %r, skipped: %s", self.name, text, error)
                yield AudioChunk(np.zeros(0, np.int16), self.sample_rate, text, error)
                continue
            continues = not ends_sentence(text)
            if pcm.size:
                yield AudioChunk(pcm, self.sample_rate, text)
