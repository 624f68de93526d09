"""What the far end played, from the marks it echoes: the bookkeeping every buffered phone stream
shares (Twilio's marks, Plivo's checkpoints, Vonage's notifies).

A buffered far end plays what it was sent in order and says nothing else, so each reply piece is
sent between two marks, "s<id>" (the piece starts) and "e<id>" (it ended), and their echoes are
turned into `Played` events. After a clear, the marks that were queued are forgotten: an echo of
one (some providers hand them back) means nothing, because that audio was never played.
"""
from __future__ import annotations

from collections import OrderedDict

from transport.base import Played

MAX_PENDING_MARKS = 1024  # a peer that never echoes marks cannot grow our memory


class PlayoutMarks:
    def __init__(self, limit: int = MAX_PENDING_MARKS) -> None:
        self.limit = limit
        self._pending: OrderedDict[str, tuple[int, str]] = OrderedDict()  # name -> (chunk id, event)

    def around(self, chunk_id: int) -> tuple[str, str]:
        """The names of the marks to send before and after piece `chunk_id`."""
        start, end = f"s{chunk_id}", f"e{chunk_id}"
        self._pending[start] = (chunk_id, "start")
        self._pending[end] = (chunk_id, "end")
        while len(self._pending) > self.limit:
            self._pending.popitem(last=False)
        return start, end

    def reached(self, name: str | None, now: float | None) -> Played | None:
        """The event for an echoed mark; None if it was cleared, echoed already, or not ours."""
        hit = self._pending.pop(name, None) if name is not None else None
        return Played(hit[0], hit[1], now) if hit is not None else None

    def clear(self) -> None:
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._pending)
