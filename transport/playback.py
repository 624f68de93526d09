"""Reply audio waiting for a real-time clock that is not ours: a phone peer that plays what it
gets at once (AudioSocket's pacer ticks every 20 ms) or a sound card (its callback asks for the
next block). Clock-free and I/O-free: whoever owns the clock calls `tick`."""
from __future__ import annotations

from collections import deque

import numpy as np

from transport.base import Played


class Playback:
    """Reply audio waiting to go out at real time, one frame (20 ms by default) per `tick`.

    Holds at most `max_s` seconds (the session sends well under a second ahead); audio beyond
    that is refused with an OverflowError rather than kept."""

    def __init__(self, rate: int, max_s: float = 10.0, frame_s: float = 0.02) -> None:
        self.rate = rate
        self.frame = int(rate * frame_s)
        self.max_samples = int(rate * max_s)
        self._queue: deque[list] = deque()  # [chunk_id, samples, samples already sent]
        self.queued = 0  # samples not yet sent

    def push(self, chunk_id: int, pcm16: np.ndarray) -> None:
        pcm16 = np.asarray(pcm16, dtype=np.int16)
        if self.queued + pcm16.size > self.max_samples:
            raise OverflowError(f"more than {self.max_samples / self.rate:.0f} s of audio queued for playback")
        # even an empty piece (a resampler can hold back all of a short one) is queued: its
        # start and end still say that its words were reached
        self._queue.append([chunk_id, pcm16, 0])
        self.queued += pcm16.size

    def tick(self, now: float | None = None) -> tuple[np.ndarray | None, list[Played]]:
        """The next frame to send (None when there is no audio; a short last frame is padded with
        silence) and the pieces that start or end in it."""
        if not self._queue:
            return None, []
        out, events, need = [], [], self.frame
        while self._queue and need:
            item = self._queue[0]
            cid, pcm, sent = item
            if sent == 0:
                events.append(Played(cid, "start", now))
            take = pcm[sent:sent + need]
            out.append(take)
            item[2] += take.size
            need -= take.size
            self.queued -= take.size
            if item[2] >= pcm.size:
                self._queue.popleft()
                events.append(Played(cid, "end", now))
        frame = np.concatenate(out)
        return (np.pad(frame, (0, self.frame - frame.size)) if frame.size else None), events

    def clear(self) -> None:
        self._queue.clear()
        self.queued = 0
