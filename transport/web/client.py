"""A browser-protocol client: what the page does, without a browser (transport/web/protocol.py).

It says hello, streams audio as PCM16 in 20 ms frames at real time, and collects the server's JSON
events. Two ways to use it, on one mechanism (`_Link`: the connection, its reader, the paced mic):

- `converse`: the audio is fixed; events are collected until the reply is done, an error came,
  the connection was lost, or a deadline passed. The reply's audio is counted, not played. The
  tests' conversations (tests.helpers.page_conversation) and `duplex bench load` / `soak` use it.
- `play_along`: the page's player too (`PagePlayer`): the server's audio chunks play at real time
  in order on a playout clock, `clear` drops all that is unplayed at once, and a played mark goes
  back as each chunk begins, as the page's socket worker and player worklet do; the heard timeline
  is recorded. The microphone is a callable asked for each 20 ms frame, so what it says can depend
  on what was heard (`CuedMic`: clips, each placed when its cue names a time). `duplex bench
  overlap` uses it.

Times are the client's event-loop clock (`loop.time()`). A frame is sent when its last sample is
"captured", as the page's mic worklet does: sample j of a frame sent at t was captured at
t - 0.02 + j / rate.

Connection refusals before the upgrade (HTTP 503 when full, 401, 403) are raised as websockets'
`InvalidStatus`; a connection lost or closed mid-conversation is recorded in the result, not raised.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from transport.base import ProtocolError
from transport.web.protocol import decode_audio

FRAMES_PER_S = 50  # the page sends 20 ms frames
FRAME_S = 1.0 / FRAMES_PER_S
PROBE_FRAMES = 25  # the page's socket worker pings every 0.5 s of audio, for the server's clock
MAX_EVENTS = 20000  # JSON events kept per conversation; later ones are counted, not kept
LEVEL_STEP_S = 0.01  # the heard audio's level is kept per 10 ms


@dataclass
class _Conversation:
    """What every conversation records: the server's JSON events, and how the connection ended."""

    events: list[dict]
    ready: bool = False
    close_code: int | None = None  # set when the connection ended before we closed it
    close_reason: str = ""
    timed_out: bool = False

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == kind]

    @property
    def lost(self) -> bool:
        """The server or the network ended the connection before we did."""
        return self.close_code is not None


@dataclass
class PageConversation(_Conversation):
    """What one `converse` saw."""

    started: float | None = None  # the first audio frame was sent
    speech_end_sent: float | None = None  # the frame holding the question's last speech sample went
    first_audio: float | None = None  # first reply audio received after speech_end_sent (or at all)
    audio_messages: int = 0
    sent_s: float = 0.0  # seconds of audio sent, padding included
    done: bool = False  # `until` held before the deadline

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


def reply_done(c: _Conversation) -> bool:
    """A reply finished (bot_done), or an error came."""
    return any(e.get("type") in ("bot_done", "error") for e in c.events)


def reply_measured(c: _Conversation) -> bool:
    """A reply finished and its latency event came (it follows bot_done), or an error came."""
    return any(e.get("type") in ("latency", "error") for e in c.events)


def pcm16_frames(audio: np.ndarray, rate: int) -> list[bytes]:
    """`audio` (float32 in [-1, 1]) as the page's 20 ms PCM16 little-endian frames."""
    frame = rate // FRAMES_PER_S
    pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1, 1) * 32767).astype("<i2")
    return [pcm[i:i + frame].tobytes() for i in range(0, pcm.size, frame)]


# ---- one connection: shared by converse and play_along -----------------------------------------
class _Link:
    """An open connection: a reader task that records the server's JSON events (and hands them and
    the audio to callbacks), `send` that records a lost connection instead of raising, `wait` for
    a condition, and `stream` that sends a mic's frames at real time."""

    def __init__(self, ws: ClientConnection, result: _Conversation,
                 on_audio: Callable[[bytes, float], None] | None = None,
                 on_event: Callable[[dict, float], None] | None = None, max_events: int = MAX_EVENTS):
        self.ws, self.result = ws, result
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()  # set at each message and at the close
        self._on_audio, self._on_event, self._max_events = on_audio, on_event, max_events
        self.events_dropped = 0
        self._reader: asyncio.Task | None = None

    def start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        # forget the reader: its cancellation's traceback holds its frame, and so this link (a
        # reference cycle that would keep the conversation until the cyclic collector ran)
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def note_close(self, exc: ConnectionClosed) -> None:
        r = self.result
        if r.close_code is None:
            rcvd = exc.rcvd
            r.close_code = rcvd.code if rcvd is not None else 1006
            r.close_reason = rcvd.reason if rcvd is not None else str(exc)
        self.changed.set()

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                t = self.loop.time()
                if isinstance(msg, str):
                    event = json.loads(msg)
                    if len(self.result.events) < self._max_events:
                        self.result.events.append(event)
                    else:
                        self.events_dropped += 1
                    if event.get("type") == "ready":
                        self.result.ready = True
                    if self._on_event is not None:
                        self._on_event(event, t)
                elif self._on_audio is not None:
                    self._on_audio(msg, t)
                self.changed.set()
        except ConnectionClosed as exc:
            self.note_close(exc)
            return
        self.note_close(ConnectionClosed(self.ws.close_rcvd, self.ws.close_sent))  # ended by a normal close

    async def send(self, data: str | bytes) -> bool:
        """False when the connection is gone (recorded in the result)."""
        if self.result.lost:
            return False
        try:
            await self.ws.send(data)
            return True
        except ConnectionClosed as exc:
            self.note_close(exc)
            return False

    async def wait(self, deadline: float, enough: Callable[[], bool]) -> None:
        """Until `enough()` holds, the connection is gone, or `deadline`."""
        while not enough() and not self.result.lost:
            self.changed.clear()
            left = deadline - self.loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.changed.wait()

    async def stream(self, next_frame: Callable[[int], bytes | None],
                     sent: Callable[[int, float], Awaitable[None] | None] | None = None) -> None:
        """Frame k = `next_frame(k)` sent at t0 + k * 20 ms until it returns None or the connection
        is gone; `sent(k, t)` after each (awaited when it returns an awaitable)."""
        t0 = self.loop.time()
        k = 0
        while not self.result.lost:
            data = next_frame(k)
            if data is None:
                return
            if not await self.send(data):
                return
            if sent is not None and (pending := sent(k, self.loop.time())) is not None:
                await pending
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * FRAME_S - self.loop.time()))


@contextlib.asynccontextmanager
async def _linked(url: str, result: _Conversation, *, open_timeout: float, ping_interval: float | None,
                  ping_timeout: float | None, headers: dict[str, str] | None, **callbacks):
    async with connect(url, max_size=1 << 22, open_timeout=open_timeout, ping_interval=ping_interval,
                       ping_timeout=ping_timeout, additional_headers=headers) as ws:
        link = _Link(ws, result, **callbacks)
        link.start()
        try:
            yield link
        finally:
            await link.stop()


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
    quiet = bytes(2 * (rate // FRAMES_PER_S))
    end_frame = None if speech_end_s is None else max(0, int(np.ceil(speech_end_s * FRAMES_PER_S)) - 1)
    result = PageConversation(events=[] if events is None else events)

    def on_audio(_data: bytes, t: float) -> None:
        result.audio_messages += 1
        if result.first_audio is None and (end_frame is None or result.speech_end_sent is not None):
            result.first_audio = t

    def next_frame(k: int) -> bytes | None:
        if k < len(frames):
            return frames[k]
        if pad_s is not None and k * FRAME_S < pad_s and not until(result):
            return quiet
        return None

    def sent(k: int, t: float) -> None:
        if k == end_frame:
            result.speech_end_sent = t
        result.sent_s = (k + 1) * FRAME_S

    async with _linked(url, result, open_timeout=open_timeout, ping_interval=ping_interval,
                       ping_timeout=ping_timeout, headers=headers, on_audio=on_audio) as link:
        await link.send(json.dumps({"type": "hello", "sample_rate": rate}))
        result.started = link.loop.time()
        await link.stream(next_frame, sent)
        await link.wait(link.loop.time() + reply_timeout, lambda: until(result) or result.first_audio is not None)
        if result.first_audio is not None:
            await link.wait(link.loop.time() + (reply_timeout if finish_timeout is None else finish_timeout),
                            lambda: until(result))
        result.done = until(result)
        result.timed_out = not result.done and not result.lost
        if hold is not None and not result.lost:
            await hold.wait()
    return result


# ---- the page's player ----------------------------------------------------------------------------
@dataclass
class HeardChunk:
    """A chunk of the server's audio as the player played it: from `start` to `end` (loop time;
    a clear cuts `end` short), received at `received`. `levels`: its level in dBFS per 10 ms."""

    id: int
    start: float
    end: float
    received: float
    levels: tuple[float, ...] = ()

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def levels_db(pcm16: np.ndarray, rate: int, step_s: float = LEVEL_STEP_S) -> tuple[float, ...]:
    """RMS level in dBFS of each `step_s` of `pcm16` (the last step may be shorter)."""
    x = np.asarray(pcm16, dtype=np.float32) / 32768.0
    n = max(1, int(round(step_s * rate)))
    out = []
    for i in range(0, x.size, n):
        seg = x[i:i + n]
        out.append(round(10.0 * math.log10(float(np.mean(seg * seg)) + 1e-12), 1))
    return tuple(out)


class PagePlayer:
    """The page's player worklet (transport/web/static/player-worklet.js) on the loop's clock.

    A chunk pushed while the player is idle plays from now; one pushed while it plays follows the
    audio queued before it, with no gap (a chunk that arrives late just starts later). `clear`
    drops everything unplayed at once and cuts the chunk playing now. What it holds unplayed is
    bounded (`max_s`, as the worklet's ring): a chunk that would overflow it is dropped and counted.
    `due(now)` moves the chunks that have begun by `now` to `heard` and returns them: their played
    marks are due."""

    def __init__(self, rate: int, max_s: float = 30.0):
        self.rate, self.max_s = rate, max_s
        self.heard: list[HeardChunk] = []  # began playing, in order
        self._queued: deque[HeardChunk] = deque()  # received, not begun
        self._end = -math.inf  # when all that is queued has played
        self.overflows = 0
        self.clears = 0
        self.dropped_s = 0.0  # unplayed audio the clears dropped

    def unplayed_s(self, now: float) -> float:
        return max(0.0, self._end - now)

    def push(self, cid: int, pcm16: np.ndarray, now: float) -> HeardChunk | None:
        seconds = pcm16.size / self.rate
        if self.unplayed_s(now) + seconds > self.max_s:
            self.overflows += 1
            return None
        start = max(now, self._end)
        chunk = HeardChunk(cid, start, start + seconds, now, levels_db(pcm16, self.rate))
        self._queued.append(chunk)
        self._end = chunk.end
        return chunk

    def due(self, now: float) -> list[HeardChunk]:
        begun = []
        while self._queued and self._queued[0].start <= now:
            begun.append(self._queued.popleft())
        self.heard.extend(begun)
        return begun

    def next_start(self) -> float | None:
        return self._queued[0].start if self._queued else None

    def clear(self, now: float) -> float:
        """Drop all that is unplayed; returns the seconds dropped."""
        self.due(now)
        dropped = sum(c.end - c.start for c in self._queued)
        self._queued.clear()
        for c in reversed(self.heard):
            if c.end <= now:
                break
            dropped += c.end - now
            c.end = now
        self._end = now
        self.clears += 1
        self.dropped_s += dropped
        return dropped


@dataclass
class PlayedConversation(_Conversation):
    """What one `play_along` saw and played. `event_times[i]`: when `events[i]` arrived."""

    event_times: list[float] = field(default_factory=list)
    sample_rate: int | None = None  # the server's audio rate (`ready`)
    started: float | None = None  # the first mic frame was sent
    frame_times: list[float] = field(default_factory=list)  # when each mic frame was sent
    heard: list[HeardChunk] = field(default_factory=list)  # the player's, shared
    audio_messages: int = 0
    marks_sent: int = 0
    bad_audio: int = 0  # binary messages that were not a chunk id and PCM16, or came before ready
    overflows: int = 0
    dropped_s: float = 0.0
    events_dropped: int = 0
    now: float = 0.0  # the loop's time when the mic was last asked for a frame

    def captured_at(self, sample: int, rate: int) -> float | None:
        """When mic sample `sample` (of the stream at `rate`) was captured, once its frame was sent."""
        per = rate // FRAMES_PER_S
        k = sample // per
        if k >= len(self.frame_times):
            return None
        return self.frame_times[k] - FRAME_S + (sample - k * per) / rate

    def playing_at(self, t: float) -> bool:
        """A chunk of the server's audio was playing at `t`."""
        return any(c.start <= t < c.end for c in reversed(self.heard[-8:]))

    def first_heard_after(self, t: float) -> float | None:
        """When the first chunk that began at or after `t` began playing."""
        return next((c.start for c in self.heard if c.start >= t), None)


Mic = Callable[[PlayedConversation], "bytes | None"]


async def play_along(url: str, mic: Mic, rate: int, *, timeout_s: float = 60.0, end_marks: bool = False,
                     max_buffer_s: float = 30.0, open_timeout: float = 10.0, ping_interval: float | None = 20.0,
                     ping_timeout: float | None = 20.0, headers: dict[str, str] | None = None,
                     max_events: int = MAX_EVENTS) -> PlayedConversation:
    """One conversation at `url` with the page's player. `mic(conversation)` is asked for each
    20 ms frame (PCM16 at `rate`, `conversation.now` the loop time) and may look at what has been
    heard so far; the conversation ends when it returns None, the connection is lost, or
    `timeout_s` after the hello (`timed_out`); then the connection closes normally.

    As the page does: a played mark `{"type": "played", "id", "event": "start", "t", "server_ms"}`
    goes back when each chunk begins playing (`t` the client's clock in ms, `server_ms` the
    server's clock then, estimated from the pongs of a ping sent every 0.5 s of audio), and once
    per user turn a `metrics` message with mouth-to-ear (from the capture of the turn's last
    speech sample, mapped from the server's `endpoint`, to the first chunk played after it).
    The page sends no end marks; `end_marks` also sends one as each chunk ends (as a phone
    carrier's marks do)."""
    result = PlayedConversation(events=[])
    loop = asyncio.get_running_loop()
    player: PagePlayer | None = None
    wake = asyncio.Event()  # the player's queue changed: the marks task looks again
    best_rtt, server_offset = math.inf, None
    m2e_turn: tuple[int, float] | None = None  # (turn, capture of its speech end) awaiting its first play

    def on_event(event: dict, t: float) -> None:
        nonlocal player, best_rtt, server_offset, m2e_turn
        if len(result.event_times) < len(result.events):
            result.event_times.append(t)
        kind = event.get("type")
        if kind == "ready" and player is None:
            rate_out = event.get("sample_rate")
            if isinstance(rate_out, int) and rate_out > 0:
                result.sample_rate = rate_out
                player = PagePlayer(rate_out, max_buffer_s)
                result.heard = player.heard
        elif kind == "clear" and player is not None:
            player.clear(t)
            result.dropped_s = player.dropped_s
            wake.set()
        elif kind == "pong" and isinstance(event.get("t"), (int, float)) and isinstance(event.get("server_ms"), (int, float)):
            rtt = t * 1000.0 - event["t"]
            if rtt <= best_rtt:
                best_rtt, server_offset = rtt, event["server_ms"] - (event["t"] + t * 1000.0) / 2
        elif kind == "endpoint" and isinstance(event.get("turn"), int) \
                and isinstance(event.get("speech_end_stream_s"), (int, float)):
            at = result.captured_at(int(event["speech_end_stream_s"] * rate), rate)
            if at is not None:
                m2e_turn = (event["turn"], at)

    def on_audio(data: bytes, t: float) -> None:
        result.audio_messages += 1
        if player is None:
            result.bad_audio += 1
            return
        try:
            cid, pcm = decode_audio(data)
        except ProtocolError:
            result.bad_audio += 1
            return
        if player.push(cid, pcm, t) is None:
            result.overflows = player.overflows
        wake.set()

    def mark(cid: int, event: str, t: float) -> str:
        ms = t * 1000.0
        msg = {"type": "played", "id": cid, "event": event, "t": ms}
        if server_offset is not None:
            msg["server_ms"] = ms + server_offset
        return json.dumps(msg)

    async def marks(link: _Link) -> None:
        """Sends each chunk's mark as it begins (and ends), at its time on the playout clock."""
        nonlocal m2e_turn
        ends: deque[HeardChunk] = deque()
        while not result.lost:
            wake.clear()
            now = loop.time()
            if player is not None:
                for c in player.due(now):
                    result.marks_sent += await link.send(mark(c.id, "start", c.start))
                    if m2e_turn is not None and c.start >= m2e_turn[1]:
                        turn, at = m2e_turn
                        m2e_turn = None
                        await link.send(json.dumps({"type": "metrics", "turn": turn,
                                                    "mouth_to_ear_ms": round((c.start - at) * 1000.0, 1)}))
                    if end_marks:
                        ends.append(c)
                while ends and (ends[0].end <= now or ends[0].end < ends[0].start + 1e-9):
                    c = ends.popleft()
                    if c.end > c.start:  # a chunk the clear cut before it began is not reported
                        await link.send(mark(c.id, "end", c.end))
            times = [x for x in (player.next_start() if player else None,
                                 ends[0].end if ends else None) if x is not None]
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows the cancel at the hang-up when
            # a chunk wakes this loop in the same step, and the loop would then run on
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(times) - loop.time()) if times else None):
                    await wake.wait()

    def next_frame(_k: int) -> bytes | None:
        result.now = loop.time()
        if result.now >= deadline:
            result.timed_out = True
            return None
        return mic(result)

    def sent(k: int, t: float) -> Awaitable[None] | None:
        result.frame_times.append(t)
        if (k + 1) % PROBE_FRAMES == 0:
            return link.send(json.dumps({"type": "ping", "t": t * 1000.0}))
        return None

    async with _linked(url, result, open_timeout=open_timeout, ping_interval=ping_interval,
                       ping_timeout=ping_timeout, headers=headers, on_audio=on_audio, on_event=on_event,
                       max_events=max_events) as link:
        deadline = loop.time() + timeout_s
        marker = asyncio.create_task(marks(link))
        try:
            await link.send(json.dumps({"type": "hello", "sample_rate": rate}))
            result.started = loop.time()
            try:  # a server that stops reading blocks the sends: the deadline bounds them too
                async with asyncio.timeout_at(deadline):
                    await link.stream(next_frame, sent)
            except TimeoutError:
                result.timed_out = True
        finally:
            marker.cancel()
            await asyncio.gather(marker, return_exceptions=True)
            result.events_dropped = link.events_dropped
            if player is not None:
                player.due(loop.time())  # what began by the hang-up was heard
                for c in player.heard:
                    c.end = min(c.end, loop.time())
    return result


# ---- a scripted microphone ------------------------------------------------------------------------
Cue = Callable[[PlayedConversation], "float | None"]


def at_once(c: PlayedConversation) -> float:
    """A cue: now."""
    return c.now


class CuedMic:
    """A microphone timeline: `clips` (float32 at `rate`) in order, each from the first frame that
    ends at or after the time its cue gives (the cue is asked at each frame until it names one;
    it may look at what was heard), with a noise floor of `noise_rms` (seeded, deterministic)
    throughout; silence (the floor) before, between and after them. It ends (returns None) when
    `done(conversation)` holds. `onset(i, conversation)`: when clip i's first sample was captured."""

    def __init__(self, rate: int, clips: Sequence[tuple[np.ndarray, Cue]],
                 done: Callable[[PlayedConversation], bool], noise_rms: float = 0.0, seed: int = 0):
        self.rate, self.per = rate, rate // FRAMES_PER_S
        self.clips = [(np.asarray(a, dtype=np.float32), cue) for a, cue in clips]
        self.done, self.noise_rms = done, noise_rms
        self._rng = np.random.default_rng(seed)
        self.start_frames: list[int] = []  # the mic frame each clip began in
        self._clip, self._pos = 0, None  # the clip playing or awaited, and where in it

    def onset(self, i: int, c: PlayedConversation) -> float | None:
        """When clip i's first sample was captured (None: not sent yet)."""
        if i >= len(self.start_frames):
            return None
        return c.captured_at(self.start_frames[i] * self.per, self.rate)

    @property
    def sent_all(self) -> bool:
        return self._clip >= len(self.clips)

    @property
    def waiting(self) -> bool:
        """A clip is awaiting its cue."""
        return not self.sent_all and self._pos is None

    def __call__(self, c: PlayedConversation) -> bytes | None:
        if self.done(c):
            return None
        frame = np.zeros(self.per, np.float32)
        if self._clip < len(self.clips):
            audio, cue = self.clips[self._clip]
            if self._pos is None:
                at = cue(c)
                if at is not None and at <= c.now + FRAME_S:
                    self._pos = 0
                    self.start_frames.append(len(c.frame_times))  # the frame about to be sent
            if self._pos is not None:
                piece = audio[self._pos:self._pos + self.per]
                frame[:piece.size] = piece
                self._pos += self.per
                if self._pos >= audio.size:
                    self._clip, self._pos = self._clip + 1, None
        if self.noise_rms > 0:
            frame += self._rng.standard_normal(self.per).astype(np.float32) * self.noise_rms
        return (np.clip(frame, -1, 1) * 32767).astype("<i2").tobytes()
