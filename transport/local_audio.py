"""The local sound card as a transport: the microphone in, the speaker out, through sounddevice
(PortAudio). `duplex talk` uses it, as LiveKit's console mode or pipecat's LocalAudioTransport.

Both streams run on the sound card's clock, in PortAudio's callback thread, and touch nothing of
the event loop's but through `call_soon_threadsafe`:
- the microphone's callback hands each block (20 ms) to the loop, where it joins a bounded queue;
  a microphone cannot be paused, so when the session falls behind by `max_backlog_s` the oldest
  blocks are dropped and counted (`dropped_blocks`), never buffered without end; playout events
  wait in a queue of their own and are read first (they are never dropped);
- the speaker's callback takes the next block from a clock-free `Playback` buffer (reply audio
  queued by `send_audio`, at most 10 s), pads with silence when there is none, and reports which
  reply pieces started and ended in that block as `Played` events, stamped and delivered at the
  time PortAudio says the block reaches the DAC (the device's buffer ahead of it), so that the
  words counted as heard are the ones that have left the speaker. `clear` (a barge-in) empties
  the buffer at once; what PortAudio and the device already hold (`output_latency_s`, ~0.1 s)
  still plays. The speaker's buffer is `speaker_buffer_s` (0.1 s), not PortAudio's low-latency
  default: with ~40 ms a process busy with its models on two cores misses the callback's
  deadline, and the card loses reply audio (ALSA underruns: words cut from the reply).

The conversation ends (`receive` returns None) after `duration_s`, or when the microphone's
stream ends (the device went away).

There is no echo cancellation: on loudspeakers the bot hears itself and barges in on its own
voice. Use headphones.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

from transport.audio import INPUT_RATE, Int16RateAdapter, int16_to_float
from transport.base import AudioIn, AudioOut, InputEvent, Played
from transport.events import BotDone, FinalTranscript, Interrupted, SessionEvent
from transport.playback import Playback

log = logging.getLogger("duplex.local")

BLOCK_S = 0.02


class LocalAudioTransport:
    reports_playout = True  # from the speaker's callback, at the time its block reaches the DAC

    def __init__(self, input_device: int | str | None = None, output_device: int | str | None = None,
                 input_rate: int = INPUT_RATE, output_rate: int | None = None, max_backlog_s: float = 2.0,
                 duration_s: float | None = None, echo_text: bool = True, speaker_buffer_s: float = 0.1) -> None:
        import sounddevice as sd  # PortAudio is loaded only when a sound card is used

        self._sd = sd
        self.input_device, self.output_device = input_device, output_device
        self.input_rate = input_rate
        self.output_rate = output_rate or int(sd.query_devices(output_device, "output")["default_samplerate"])
        self.max_blocks = max(1, int(max_backlog_s / BLOCK_S))
        self.duration_s, self.echo_text = duration_s, echo_text
        self.speaker_buffer_s = speaker_buffer_s
        self.dropped_blocks = 0
        self.xruns = 0  # blocks the card reported lost (input overflow, output underflow)
        self.output_latency_s: float | None = None
        self._mic_blocks: deque[AudioIn] = deque(maxlen=self.max_blocks)  # full: appending drops the oldest
        self._played: deque[Played] = deque()  # at most two per reply piece in the 10 s Playback holds
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._playback = Playback(self.output_rate, frame_s=BLOCK_S)
        self._lock = threading.Lock()  # the playback buffer: the speaker's thread and the loop
        self._to_output_rate = Int16RateAdapter(self.output_rate)
        self._streams: list = []
        self._t_end: float | None = None
        self._ended = False  # the microphone is gone: the conversation ends once its audio is read

    # ---- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sd = self._sd
        mic = sd.InputStream(device=self.input_device, samplerate=self.input_rate, channels=1, dtype="int16",
                             blocksize=int(self.input_rate * BLOCK_S), callback=self._on_mic,
                             finished_callback=self._on_mic_finished)
        speaker = sd.OutputStream(device=self.output_device, samplerate=self.output_rate, channels=1, dtype="int16",
                                  blocksize=self._playback.frame, callback=self._on_speaker,
                                  latency=self.speaker_buffer_s)
        self._streams = [mic, speaker]
        for s in self._streams:
            await asyncio.to_thread(s.start)
        self.output_latency_s = float(speaker.latency)
        if self.duration_s is not None:
            self._t_end = time.perf_counter() + self.duration_s
        log.info("sound card: mic %s at %d Hz, speaker %s at %d Hz (output latency %.0f ms)",
                 self.input_device if self.input_device is not None else "default", self.input_rate,
                 self.output_device if self.output_device is not None else "default", self.output_rate,
                 self.output_latency_s * 1000)

    async def close(self) -> None:
        for s in self._streams:
            await asyncio.to_thread(s.close)
        self._streams = []

    # ---- PortAudio's thread ----------------------------------------------------------------
    def _on_mic(self, indata, frames, time_info, status) -> None:
        if status:
            self._loop.call_soon_threadsafe(self._xrun, str(status))
        block = indata[:, 0].copy()
        self._loop.call_soon_threadsafe(self._arrive, AudioIn(int16_to_float(block), self.input_rate))

    def _on_mic_finished(self) -> None:
        """The microphone's stream ended (closed by us, or the device went away)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._mic_gone)

    def _on_speaker(self, outdata, frames, time_info, status) -> None:
        if status:
            self._loop.call_soon_threadsafe(self._xrun, str(status))
        # this block leaves the speaker when PortAudio says its first sample reaches the DAC
        # (the device's buffer ahead of it): its pieces are played then, not now
        ahead = time_info.outputBufferDacTime - time_info.currentTime
        ahead = ahead if 0.0 <= ahead < 1.0 else self.output_latency_s or 0.0
        audible = time.perf_counter() + ahead
        with self._lock:
            frame, events = self._playback.tick(audible)
        outdata[:, 0] = 0 if frame is None else frame[:frames]
        if events:
            self._loop.call_soon_threadsafe(self._arrive_at, audible, events)

    # ---- the loop's side -------------------------------------------------------------------
    def _arrive_at(self, audible: float, events: list) -> None:
        """Playout events of a block, delivered when the block becomes audible."""
        for ev in events:
            self._loop.call_later(max(0.0, audible - time.perf_counter()), self._arrive, ev)

    def _mic_gone(self) -> None:
        self._ended = True
        self._wake.set()

    def _xrun(self, what: str) -> None:
        self.xruns += 1
        if self.xruns in (1, 10) or self.xruns % 1000 == 0:
            log.warning("sound card: %s (%d so far)", what, self.xruns)

    def _arrive(self, ev: AudioIn | Played) -> None:
        if isinstance(ev, Played):
            self._played.append(ev)
        else:
            if len(self._mic_blocks) == self.max_blocks:  # the session is behind: the oldest block goes
                self.dropped_blocks += 1
                if self.dropped_blocks in (1, 10) or self.dropped_blocks % 1000 == 0:
                    log.warning("microphone: %d blocks of 20 ms dropped so far (the session fell behind)",
                                self.dropped_blocks)
            self._mic_blocks.append(ev)
        self._wake.set()

    async def receive(self) -> InputEvent | None:
        while not (self._played or self._mic_blocks):
            if self._ended:
                return None
            self._wake.clear()
            timeout = None if self._t_end is None else self._t_end - time.perf_counter()
            if timeout is not None and timeout <= 0:
                return None
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                return None
        if self._t_end is not None and time.perf_counter() >= self._t_end:
            return None
        return self._played.popleft() if self._played else self._mic_blocks.popleft()

    async def send_audio(self, chunk: AudioOut) -> None:
        pcm = self._to_output_rate(chunk.pcm, chunk.sample_rate)
        with self._lock:
            self._playback.push(chunk.chunk_id, pcm)

    async def clear(self) -> None:
        with self._lock:
            self._playback.clear()

    async def send_event(self, event: SessionEvent) -> None:
        """The console's view of the conversation: what was heard, and the bot's words."""
        if not self.echo_text:
            return
        if isinstance(event, FinalTranscript) and event.text:
            print(f"you: {event.text}", flush=True)
        elif isinstance(event, BotDone):
            print(f"bot: {event.text}", flush=True)
        elif isinstance(event, Interrupted):
            print(f"     (interrupted; heard: {event.heard!r})", flush=True)
