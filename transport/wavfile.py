"""WAV-file transport for offline runs, tests and benchmarks.

It plays a scripted conversation into the session at real-time pace (20 ms frames): each input
file, then silence until the bot's reply has been played out and `gap_s` has passed (a reply is
over when its audio has played and the session's state says it no longer thinks or speaks, so a
slow model's pause between two chunks does not end it). An input may instead start a fixed time
after the previous one ended, or after the bot's reply began playing (to talk over it at a known
point of the reply, whatever the models' speed). It acts as
the far end's player too: reply audio is laid on an output timeline at the moment it would play,
`clear()` drops what was not yet played, and Played marks come back when a chunk starts.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from transport.audio import INPUT_RATE, Int16RateAdapter
from transport.base import AudioIn, AudioOut, InputEvent, Played
from transport.events import SessionEvent, StateChanged

FRAME_S = 0.02


@dataclass
class ScriptedTurn:
    pcm: np.ndarray  # float32 mono at `sample_rate`
    sample_rate: int
    name: str = ""
    # when to start this input: None, after the reply has played out (and the gap); else this many
    # seconds after the previous input ended, or (`from_reply`) after the first reply audio played since
    start_after_s: float | None = None
    from_reply: bool = False


def load_turn(path: str, start_after_s: float | None = None, from_reply: bool = False) -> ScriptedTurn:
    data, rate = sf.read(path, dtype="float32", always_2d=True)
    return ScriptedTurn(data.mean(axis=1), int(rate), path, start_after_s, from_reply)


@dataclass
class _Scheduled:
    chunk_id: int
    start: int  # sample on the output timeline
    pcm: np.ndarray
    played: int = 0  # samples already played


class WavConversationTransport:
    reports_playout = True

    def __init__(self, turns: list[ScriptedTurn], output_sample_rate: int, output_path: str,
                 gap_s: float = 1.0, reply_timeout_s: float = 30.0, realtime: bool = True):
        self.turns = turns
        self.output_sample_rate = output_sample_rate
        self.gap_s, self.reply_timeout_s, self.realtime = gap_s, reply_timeout_s, realtime
        self.input_rate = turns[0].sample_rate if turns else INPUT_RATE
        self._t0: float | None = None
        self._frames_sent = 0
        self._events: deque[InputEvent] = deque()
        self._queued: deque[_Scheduled] = deque()  # reply audio not yet fully played (bounded by playout lead)
        # the played timeline (what a listener heard), streamed to disk as it is played
        self._sink = sf.SoundFile(output_path, "w", samplerate=output_sample_rate, channels=1, subtype="PCM_16")
        self._out_len = 0  # samples written to the timeline so far
        self._audio_end = 0  # output sample at which queued reply audio runs out
        self._got_audio_this_turn = False
        self._reply_played_at: float | None = None  # timeline second the reply to the last input began playing
        self._bot_busy = False  # the session's last state event: thinking or speaking a reply
        self.input_end_times: list[float] = []  # timeline seconds at which each input file ended
        self.input_start_times: list[float] = []
        # what the far end saw and played (bounded): sent audio with its text, play starts, clears
        self.events_log: deque[dict] = deque(maxlen=20000)
        self._to_output_rate = Int16RateAdapter(output_sample_rate)
        self._gen = self._frames()

    # timeline ----------------------------------------------------------------------------
    @property
    def t0(self) -> float | None:
        """time.perf_counter() of timeline second 0 (set on the first receive), or None before."""
        return self._t0

    def now(self) -> float:
        """Seconds on the conversation timeline (input audio sent so far)."""
        return self._frames_sent * FRAME_S

    def _advance_playout(self, until: float) -> None:
        """Move the far-end player forward to timeline second `until` (all in whole samples)."""
        target = int(round(until * self.output_sample_rate))
        while self._out_len < target:
            item = self._queued[0] if self._queued else None
            if item is None or item.start > self._out_len:  # silence up to the next chunk
                stop = min(item.start if item else target, target)
                self._sink.write(np.zeros(stop - self._out_len, dtype=np.int16))
                self._out_len = stop
                continue
            if item.played == 0:
                if self._reply_played_at is None:
                    self._reply_played_at = self._out_len / self.output_sample_rate
                self._events.append(Played(item.chunk_id, "start"))
                self.events_log.append({"type": "played", "id": item.chunk_id,
                                        "t": self._out_len / self.output_sample_rate})
            n = min(item.pcm.size - item.played, target - self._out_len)
            self._sink.write(item.pcm[item.played:item.played + n])
            item.played += n
            self._out_len += n
            if item.played >= item.pcm.size:
                self._queued.popleft()
                self._events.append(Played(item.chunk_id, "end"))
                self.events_log.append({"type": "played_end", "id": item.chunk_id,
                                        "t": self._out_len / self.output_sample_rate})

    # input -------------------------------------------------------------------------------
    def _frames(self):
        """Yield (pcm frame, rate) for the whole script, silence included."""
        rate = self.input_rate
        n = int(FRAME_S * rate)
        silence = np.zeros(n, dtype=np.float32)
        for i, turn in enumerate(self.turns):
            if turn.sample_rate != rate:
                raise ValueError(f"{turn.name}: all inputs must share one sample rate ({rate} Hz)")
            if i and turn.start_after_s is not None:
                since = self.input_end_times[-1]
                if turn.from_reply:
                    deadline = self.now() + self.reply_timeout_s
                    while self._reply_played_at is None and self.now() < deadline:
                        yield silence
                    since = self._reply_played_at if self._reply_played_at is not None else self.now()
                while self.now() < since + turn.start_after_s:
                    yield silence
            elif i:
                yield from self._wait_for_reply(silence)
            self._got_audio_this_turn = False
            self.input_start_times.append(self.now())
            for k in range(0, turn.pcm.size, n):
                frame = turn.pcm[k:k + n]
                yield np.pad(frame, (0, n - frame.size))
            self.input_end_times.append(self.now())
            self._got_audio_this_turn = False  # only audio sent after the input ended answers it
            self._reply_played_at = None
        yield from self._wait_for_reply(silence)

    def _wait_for_reply(self, silence):
        deadline = self.now() + self.reply_timeout_s
        while self.now() < deadline:
            audio_end = self._audio_end / self.output_sample_rate
            idle = self.now() - max(audio_end, self.input_end_times[-1] if self.input_end_times else 0)
            if self._got_audio_this_turn and not self._queued and not self._bot_busy and idle >= self.gap_s:
                return
            yield silence

    async def receive(self) -> InputEvent | None:
        if self._events:
            return self._events.popleft()
        if self._t0 is None:
            self._t0 = time.perf_counter()
        frame = next(self._gen, None)
        if frame is None:
            return None
        if self.realtime:
            due = self._t0 + self._frames_sent * FRAME_S
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)
        self._frames_sent += 1
        self._advance_playout(self.now())
        audio = AudioIn(frame, self.input_rate)
        if self._events:
            # playback marks of this same 20 ms come first: what the far end played while this
            # frame was spoken is known before the frame is (a barge-in in it counts those words)
            self._events.append(audio)
            return self._events.popleft()
        return audio

    # output ------------------------------------------------------------------------------
    async def send_audio(self, chunk: AudioOut) -> None:
        pcm = self._to_output_rate(chunk.pcm, chunk.sample_rate)
        start = max(int(round(self.now() * self.output_sample_rate)), self._audio_end)
        self._queued.append(_Scheduled(chunk.chunk_id, start, pcm))
        self.events_log.append({"type": "audio", "id": chunk.chunk_id, "text": chunk.text, "t": self.now()})
        self._audio_end = start + pcm.size
        self._got_audio_this_turn = True

    async def clear(self) -> None:
        self._queued.clear()
        self._got_audio_this_turn = False
        self._audio_end = self._out_len
        self.events_log.append({"type": "clear", "t": self.now()})

    async def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, StateChanged):
            self._bot_busy = event.busy
        self.events_log.append({**event.to_wire(), "t": self.now()})

    def close(self) -> None:
        """Play out what is left and close the output file (the bot's channel, aligned with the input)."""
        if not self._sink.closed:
            self._advance_playout(max(self.now(), self._audio_end / self.output_sample_rate))
            self._sink.close()
