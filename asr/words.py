"""The words a stream has said and a turn has not yet taken: the one place where a reader of
`RecognizerStream.events()` keeps words and answers flushes. `flush(stream, until)` asks the
stream to push every word that ends before `until` out, and returns once that flush has come
back through the reader (`on_event`); `take(until)` then hands over the words that began
before it. Bounded: a stream that speaks on with no one taking its words keeps the last ones."""
from __future__ import annotations

import asyncio
from collections import deque

from asr.base import Flushed, RecognizerStream, Word, WordEvent


class HeardWords:
    def __init__(self, max_words: int = 512):
        self.words: deque[Word] = deque(maxlen=max_words)
        self._sent = 0  # flushes asked for
        self._seen = 0  # flushes come back through the reader
        self._came = asyncio.Event()
        self._lock = asyncio.Lock()  # one flush at a time: each waits for its own to come back

    def on_event(self, event) -> bool:
        """Keep a word, or count a flush; False for any other event (the caller's)."""
        if isinstance(event, WordEvent):
            self.words.append(event.word)
        elif isinstance(event, Flushed):
            self._seen += 1
            self._came.set()
        else:
            return False
        return True

    async def flush(self, stream: RecognizerStream, until: float) -> None:
        """Until every word that ends before stream time `until` has come out of `stream`."""
        async with self._lock:
            self._sent += 1
            target = self._sent
            await stream.flush(until)
            while self._seen < target:
                self._came.clear()
                await self._came.wait()

    def take(self, until: float, keep: bool = False) -> tuple[str, tuple[Word, ...]]:
        """The words that began before `until` (one a recognizer ends a little past it, by a
        server's post-roll or a frame's rounding, still belongs), as text and words; they leave
        unless `keep`."""
        words = tuple(w for w in self.words if w.start < until)
        if not keep:
            rest = [w for w in self.words if w.start >= until]
            self.words.clear()
            self.words.extend(rest)
        return " ".join(w.text for w in words).strip(), words

    def drop_ended_by(self, t: float) -> None:
        """Forget the words that ended by stream time `t` (noise before an utterance)."""
        while self.words and self.words[0].end <= t:
            self.words.popleft()
