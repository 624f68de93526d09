"""A browser-protocol client: what the page does, without a browser (transport/web/protocol.py).

It says hello, streams audio as PCM16 in 20 ms frames at real time, and collects the server's JSON
events until the reply is done, an error came, the connection was lost, or a deadline passed. The
tests' conversations (tests.helpers.page_conversation) and `duplex bench load` / `soak` use it.

Connection refusals before the upgrade (HTTP 503 when full, 401, 403) are raised as websockets'
`InvalidStatus`; a connection lost or closed mid-conversation is recorded in the result, not raised.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

FRAMES_PER_S = 50  # the page sends 20 ms frames


@dataclass
class PageConversation:
    """What one conversation saw. Times are the client's event-loop clock (`loop.time()`)."""

    events: list[dict]
    ready: bool = False
    started: float | None = None  # the first audio frame was sent
    speech_end_sent: float | None = None  # the frame holding the question's last speech sample went
    first_audio: float | None = None  # first reply audio received after speech_end_sent (or at all)
    audio_messages: int = 0
    sent_s: float = 0.0  # seconds of audio sent, padding included
    done: bool = False  # `until` held before the deadline
    close_code: int | None = None  # set when the connection ended before we closed it
    close_reason: str = ""
    timed_out: bool = False

    @property
    def voice_to_voice_ms(self) -> float | None:
        """Client-side: the frame with the last speech sample sent -> first reply audio received."""
        if self.first_audio is None or self.speech_end_sent is None:
            return None
        return (self.first_audio - self.speech_end_sent) * 1000.0

    @property
    def server_voice_to_voice_ms(self) -> float | None:
        """The server's own figure, from its first latency event that has one."""
        for e in self.events:
            if e.get("type") == "latency" and e.get("voice_to_voice_ms") is not None:
                return float(e["voice_to_voice_ms"])
        return None

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == kind]

    @property
    def lost(self) -> bool:
        """The server or the network ended the connection before we did."""
        return self.close_code is not None


def reply_done(c: PageConversation) -> bool:
    """A reply finished (bot_done), or an error came."""
    return any(e.get("type") in ("bot_done", "error") for e in c.events)


def reply_measured(c: PageConversation) -> bool:
    """A reply finished and its latency event came (it follows bot_done), or an error came."""
    return any(e.get("type") in ("latency", "error") for e in c.events)


def pcm16_frames(audio: np.ndarray, rate: int) -> list[bytes]:
    """`audio` (float32 in [-1, 1]) as the page's 20 ms PCM16 little-endian frames."""
    frame = rate // FRAMES_PER_S
    pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1, 1) * 32767).astype("<i2")
    return [pcm[i:i + frame].tobytes() for i in range(0, pcm.size, frame)]


async def converse(url: str, audio: np.ndarray | list[bytes], rate: int, *,
                   events: list[dict] | None = None, speech_end_s: float | None = None,
                   until: Callable[[PageConversation], bool] = reply_done,
                   reply_timeout: float = 30.0, finish_timeout: float | None = None,
                   pad_s: float | None = None, hold: asyncio.Event | None = None,
                   open_timeout: float = 10.0, ping_interval: float | None = 20.0,
                   ping_timeout: float | None = 20.0, headers: dict[str, str] | None = None) -> PageConversation:
    """One conversation at `url` (ws://HOST:PORT/ws[?token=...]).

    `audio`: float32 samples at `rate`, or frames from `pcm16_frames`, sent at real time.
    `speech_end_s`: where the question's speech ends in `audio`, for the client-side
    voice-to-voice. `pad_s`: after the audio, go on sending silence (as a live microphone does)
    until `until` holds or `pad_s` seconds from the first frame have passed. Then wait up to
    `reply_timeout` seconds after the last frame sent for the reply to start (its first audio),
    and from then up to `finish_timeout` (default `reply_timeout`) for `until`; stay connected
    until `hold` is set, if given; close normally."""
    frames = pcm16_frames(audio, rate) if isinstance(audio, np.ndarray) else list(audio)
    step = 1.0 / FRAMES_PER_S
    quiet = bytes(2 * (rate // FRAMES_PER_S))
    end_frame = None if speech_end_s is None else max(0, int(np.ceil(speech_end_s * FRAMES_PER_S)) - 1)
    result = PageConversation(events=[] if events is None else events)
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()
    async with connect(url, max_size=1 << 22, open_timeout=open_timeout, ping_interval=ping_interval,
                       ping_timeout=ping_timeout, additional_headers=headers) as ws:

        def note_close(exc: ConnectionClosed) -> None:
            if result.close_code is None:
                rcvd = exc.rcvd
                result.close_code = rcvd.code if rcvd is not None else 1006
                result.close_reason = rcvd.reason if rcvd is not None else str(exc)
            changed.set()

        async def read() -> None:
            try:
                async for msg in ws:
                    if isinstance(msg, str):
                        event = json.loads(msg)
                        result.events.append(event)
                        if event.get("type") == "ready":
                            result.ready = True
                    else:
                        result.audio_messages += 1
                        if result.first_audio is None and (end_frame is None or result.speech_end_sent is not None):
                            result.first_audio = loop.time()
                    changed.set()
            except ConnectionClosed as exc:
                note_close(exc)
                return
            note_close(ConnectionClosed(ws.close_rcvd, ws.close_sent))  # ended by a normal close

        async def wait(deadline: float, enough: Callable[[PageConversation], bool]) -> None:
            """Until `enough` holds, the connection is gone, or `deadline`."""
            while not enough(result) and not result.lost:
                changed.clear()
                left = deadline - loop.time()
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except TimeoutError:
                    pass

        reader = asyncio.create_task(read())
        try:
            await ws.send(json.dumps({"type": "hello", "sample_rate": rate}))
            t0 = result.started = loop.time()
            k = 0
            try:
                while not result.lost:
                    if k < len(frames):
                        data = frames[k]
                    elif pad_s is not None and k * step < pad_s and not until(result):
                        data = quiet
                    else:
                        break
                    await ws.send(data)
                    if k == end_frame:
                        result.speech_end_sent = loop.time()
                    k += 1
                    result.sent_s = k * step
                    await asyncio.sleep(max(0.0, t0 + k * step - loop.time()))
            except ConnectionClosed as exc:
                note_close(exc)
            await wait(loop.time() + reply_timeout, lambda c: until(c) or c.first_audio is not None)
            if result.first_audio is not None:
                await wait(loop.time() + (reply_timeout if finish_timeout is None else finish_timeout), until)
            result.done = until(result)
            result.timed_out = not result.done and not result.lost
            if hold is not None and not result.lost:
                await hold.wait()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return result

