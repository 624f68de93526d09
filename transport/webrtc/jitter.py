"""A jitter buffer for incoming Opus that gives each packet out as soon as it is the next one.

aiortc's audio receiver holds 4 packets before it gives the oldest out (`JitterBuffer(16,
prefetch=4)`: 80 ms on every mic frame), and it gives out at most one frame per packet in, so
once a packet is lost the frames queued behind the gap stay queued: 14 frames (280 ms) of lag
for the rest of the call. Our reader has no playout clock to smooth for (the server's mic goes
to the VAD and the recognizer as fast as it comes), so:

- in order, the next packet goes out at once: no lag on a clean link;
- a missing packet is waited for while fewer than `max_wait` later ones are here (reordering),
  then given up (a lost 20 ms: Opus's own loss concealment is not ours to run);
- the lag never exceeds `max_lag` frames: beyond that the oldest frames are dropped, so a loss
  or a burst costs a little audio once, not latency for the rest of the call.

Installed on a receiver with `use_low_latency_audio(pc)`, after the remote description has
created the transceivers and before any packet arrives. aiortc has no setting for its receiver's
jitter buffer: this replaces the private attribute, and says so (a warning, aiortc's own buffer
kept) if a later aiortc has moved it (tests/test_webrtc.py checks that it holds).
"""
from __future__ import annotations

import logging

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.utils import uint16_add, uint16_gt

log = logging.getLogger("duplex.webrtc")
_ATTR = "_RTCRtpReceiver__jitter_buffer"  # aiortc 1.16's private name for it


class AudioJitterBuffer(JitterBuffer):
    """One Opus packet is one frame: give it out as soon as every earlier one has gone."""

    def __init__(self, capacity: int = 16, max_wait: int = 2, max_lag: int = 3) -> None:
        super().__init__(capacity)
        if not 0 <= max_wait <= max_lag < capacity:
            raise ValueError(f"need 0 <= max_wait ({max_wait}) <= max_lag ({max_lag}) < capacity ({capacity})")
        self.max_wait, self.max_lag = max_wait, max_lag
        self._newest: int | None = None
        self.lost = self.dropped = 0  # packets given up on, frames dropped to cap the lag

    def _present(self) -> bool:
        return self._packets[self._origin % self._capacity] is not None

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        if self._newest is None or uint16_gt(sequence_number, self._newest):
            self._newest = sequence_number
        behind = uint16_add(self._newest, -self._origin)  # packets after the oldest awaited
        if behind >= self._capacity:  # aiortc moved its origin (a jump in sequence numbers)
            self._newest = sequence_number
            behind = uint16_add(sequence_number, -self._origin)
        if not self._present():
            if behind < self.max_wait:
                return None  # it may still come
            while not self._present():
                self.remove(1)
                self.lost += 1
            behind = uint16_add(self._newest, -self._origin)
        while behind > self.max_lag:  # cap the lag: the oldest frames go
            self.dropped += self._present()
            self.remove(1)
            behind -= 1
            while not self._present():
                self.remove(1)
                self.lost += 1
                behind -= 1
        packet = self._packets[self._origin % self._capacity]
        self.remove(1)
        return JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


def use_low_latency_audio(pc: RTCPeerConnection, **options) -> int:
    """Give each audio receiver of `pc` an AudioJitterBuffer; how many got one."""
    done = 0
    for t in pc.getTransceivers():
        if t.kind != "audio":
            continue
        if not isinstance(getattr(t.receiver, _ATTR, None), JitterBuffer):
            log.warning("aiortc's receiver has no %s: its own jitter buffer stays (+80 ms on the mic)", _ATTR)
            continue
        setattr(t.receiver, _ATTR, AudioJitterBuffer(**options))
        done += 1
    return done
