"""How a reply's stages run: all at once (`Concurrent`, the product) or strictly one after
another (`Waterfall`, the baseline `duplex bench latency` compares against). The reply asks its
pipeline for a flow, which carries the text from the LLM to the voice and the audio to the line;
the session asks it whether to read the user's words ahead and to speculate."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ClassVar, Protocol

from agent.workers import cancel_and_wait
from tts.base import AudioChunk


class Flow(Protocol):
    """One reply's path from the LLM's text to the voice and from the voice to the line."""

    async def run(self, think: Callable[[], Awaitable[None]], speak: Callable[[], Awaitable[None]]) -> None:
        """Run the LLM side (`think`) and the voice side (`speak`)."""

    async def put(self, piece: str) -> None:
        """A piece of text for the voice."""

    async def close(self) -> None:
        """No more text."""

    def pieces(self) -> AsyncIterator[str]:
        """The text for the voice, as it may be spoken."""

    def voiced(self) -> None:
        """The voice has turned the first piece into audio (or failed on it)."""

    async def audio(self, chunk: AudioChunk, play: Callable[[AudioChunk], Awaitable[None]]) -> None:
        """One chunk of audio for the line."""

    async def finish(self, play: Callable[[AudioChunk], Awaitable[None]]) -> None:
        """The voice is done: play what was kept."""


class StreamedFlow:
    """The LLM's pieces go to the voice as they come, and its audio out at once. First audio
    first: once the first piece is out, the LLM waits until the voice has turned it into audio.
    On a CPU the two would share the cores and both run at half speed while the first chunk is
    the only thing the user waits for; later tokens have the first chunk's playout to arrive in.
    The queue has room for the whole answer (a piece holds a token at least), so the LLM, one
    model for every conversation, waits on the voice only for the first piece."""

    def __init__(self, max_tokens: int):
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=max_tokens + 1)
        self._first_voiced = asyncio.Event()

    async def run(self, think, speak) -> None:
        """Both at once; the first to fail cancels the other and its error is raised. (Not a
        TaskGroup: on this Python its cancellation keeps the error in a frame of its own, a
        cycle that would hold the reply until the cyclic collector runs.)"""
        tasks = [asyncio.create_task(think(), name="think"), asyncio.create_task(speak(), name="speak")]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
            if failed:
                raise failed[0].exception()
        finally:
            await cancel_and_wait(*tasks)
            tasks = failed = None  # the frame stays in the error's traceback: it holds no tasks

    async def put(self, piece: str) -> None:
        await self._queue.put(piece)
        await self._first_voiced.wait()

    async def close(self) -> None:
        await self._queue.put(None)

    async def pieces(self) -> AsyncIterator[str]:
        while (piece := await self._queue.get()) is not None:
            yield piece
            self._first_voiced.set()  # back for more: that piece is done (spoken, or had no words)

    def voiced(self) -> None:
        self._first_voiced.set()

    async def audio(self, chunk, play) -> None:
        await play(chunk)

    async def finish(self, play) -> None:
        pass


class HeldFlow:
    """The whole answer is written before the voice starts, and the whole audio made before it
    plays."""

    def __init__(self):
        self._text: list[str] = []
        self._audio: list[AudioChunk] = []

    async def run(self, think, speak) -> None:
        await think()
        await speak()

    async def put(self, piece: str) -> None:
        self._text.append(piece)

    async def close(self) -> None:
        pass

    async def pieces(self) -> AsyncIterator[str]:
        for piece in self._text:
            yield piece

    def voiced(self) -> None:
        pass

    async def audio(self, chunk, play) -> None:
        self._audio.append(chunk)

    async def finish(self, play) -> None:
        for chunk in self._audio:
            await play(chunk)


class Pipeline(Protocol):
    name: ClassVar[str]
    reads_ahead: ClassVar[bool]  # the LLM reads the user's words while they speak
    speculates: ClassVar[bool]  # replies start in the pause, before the turn is confirmed

    def flow(self, max_tokens: int) -> Flow: ...


class Concurrent:
    name: ClassVar[str] = "concurrent"
    reads_ahead: ClassVar[bool] = True
    speculates: ClassVar[bool] = True

    def flow(self, max_tokens: int) -> Flow:
        return StreamedFlow(max_tokens)


class Waterfall:
    name: ClassVar[str] = "waterfall"
    reads_ahead: ClassVar[bool] = False  # its LLM sees nothing before the final transcript
    speculates: ClassVar[bool] = False

    def flow(self, max_tokens: int) -> Flow:
        return HeldFlow()


PIPELINES: dict[str, Pipeline] = {p.name: p() for p in (Concurrent, Waterfall)}


def pipeline_named(name: str) -> Pipeline:
    try:
        return PIPELINES[name]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(PIPELINES)}, not {name!r}") from None
