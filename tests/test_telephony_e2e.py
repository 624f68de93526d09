"""Phone calls to `duplex serve`, with the real default models: one through the Twilio endpoint,
one through AudioSocket, as Asterisk would make it, one through the Plivo endpoint in 16 kHz
linear PCM and one through the Vonage endpoint at 24 kHz.

As Twilio, the test plays its part of a bidirectional media stream: it sends the caller's audio as
8 kHz mu-law at real-time pace (encoded with audioop, not our codec), plays what the bot sends
on its own 20 ms clock, echoes each mark when playback reaches it, and on `clear` drops its
queue and hands back the queued marks, as Twilio does. As Plivo and Vonage, it does the same
with their messages (checkpoint/playedStream/clearAudio; binary frames, notify and clear), but
a clear hands back no marks. As
Asterisk, it sends 20 ms slin frames and plays the bot's frames as they arrive. In every call
the caller asks a question, asks for a story and talks over it, after a few malformed messages
the call must survive.
"""
from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from helpers import CAPITAL_QUESTION, closest, duplex_serve, free_port, hear_answer, is_word_prefix, report_figure, say, silence, speech_onset_s, wait_until
from media_stream_peers import Peer, peer

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")

pytestmark = pytest.mark.models
FRAME = 160  # 20 ms at 8 kHz
STORYTELLER = ("You are a storyteller. Answer every request with a long, detailed story of at least "
               "ten sentences. Answer questions in one sentence.")


class FakeProvider:
    """The provider's side of one media stream (see the module docstring); `far` says how it
    words its messages (`media_stream_peers`)."""

    def __init__(self, ws, far: Peer):
        self.ws, self.far = ws, far
        self.frame = far.rate // 50  # 20 ms
        self.queue: deque = deque()  # ("audio", int16 samples) | ("mark", name), in arrival order
        self.played: list[np.ndarray] = []  # the caller's earpiece, one 20 ms frame per tick
        self.filled: list[int] = []  # samples of each played frame that were the bot's (the rest: padding)
        self.log: list[tuple[float, str, object]] = []  # (seconds since the call began, kind, data)
        self.t0 = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def encode(self, pcm: np.ndarray) -> bytes:
        return audioop.lin2ulaw(pcm.tobytes(), 2) if self.far.encoding == "audio/x-mulaw" else pcm.astype("<i2").tobytes()

    def decode(self, data: bytes) -> np.ndarray:
        return np.frombuffer(audioop.ulaw2lin(data, 2) if self.far.encoding == "audio/x-mulaw" else data, "<i2")

    async def echo(self, name: str) -> None:
        self.log.append((self.now(), "echo", name))
        await self.ws.send(self.far.echo(name))

    async def call(self, caller: np.ndarray) -> None:
        """`caller`: float audio at the stream's rate."""
        if (connected := self.far.connected()) is not None:
            await self.ws.send(connected)
        await self.ws.send(self.far.start())
        # bad input the call must survive (providers read no errors: the server logs and skips them)
        for bad in ("{not json", json.dumps({"event": "media", "media": {"payload": "@@"}}),
                    json.dumps({"event": "hangup"}), b"\x00binary"):
            await self.ws.send(bad)
        self.t0 = time.perf_counter()
        reader = asyncio.create_task(self.read())
        pcm, n = (np.clip(caller, -1, 1) * 32767).astype(np.int16), self.frame
        for k, i in enumerate(range(0, pcm.size - n + 1, n)):
            await asyncio.sleep(max(0.0, self.t0 + k * 0.02 - time.perf_counter()))
            await self.ws.send(self.far.media(self.encode(pcm[i:i + n]), chunk=k + 1))
            await self.play_one_frame()
        if (stop := self.far.stop()) is not None:
            await self.ws.send(stop)
        reader.cancel()

    async def read(self) -> None:
        async for message in self.ws:
            kind, item = self.far.read(message)  # checks the stream id, encoding and rate
            if kind == "audio":
                pcm = self.decode(item)
                self.queue.append(("audio", pcm))
                self.log.append((self.now(), "media", pcm.size))
            elif kind == "mark":
                self.queue.append(("mark", item))
                self.log.append((self.now(), "mark", item))
            elif kind == "clear":
                self.log.append((self.now(), "clear", None))
                marks = [x for k, x in self.queue if k == "mark"]
                self.queue.clear()
                if self.far.echoes_cleared_marks:  # Twilio returns the marks that were still queued
                    for name in marks:
                        await self.ws.send(self.far.echo(name))
                if (cleared := self.far.cleared()) is not None:
                    await self.ws.send(cleared)

    async def play_one_frame(self) -> None:
        n = self.frame
        out = np.zeros(0, np.int16)
        while self.queue and out.size < n:
            kind, item = self.queue[0]
            if kind == "mark":
                self.queue.popleft()
                await self.echo(item)
                continue
            take = item[:n - out.size]
            out = np.concatenate([out, take])
            if take.size == item.size:
                self.queue.popleft()
            else:
                self.queue[0] = ("audio", item[take.size:])
        while self.queue and self.queue[0][0] == "mark":  # marks right after this frame's audio
            await self.echo(self.queue.popleft()[1])
        self.played.append(np.pad(out, (0, n - out.size)))
        self.filled.append(out.size)

    @property
    def rate(self) -> int:
        return self.far.rate

    def answer(self, start_s: float, end_s: float) -> tuple[np.ndarray, int]:
        """The bot's samples played between the two times on the call's clock (20 ms ticks), and
        how many frames between its first and last were padded for want of audio."""
        ticks = range(int(start_s * 50), min(int(end_s * 50), len(self.played)))
        spoken = [k for k in ticks if self.filled[k]]
        gaps = sum(1 for k in range(spoken[0], spoken[-1]) if self.filled[k] < self.frame) if spoken else 0
        return np.concatenate([self.played[k][:self.filled[k]] for k in ticks] or [np.zeros(0, np.int16)]), gaps


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """The caller's side of the call at 16 kHz, and when each part of it starts and ends (s)."""
    d = tmp_path_factory.mktemp("caller")
    parts = {"lead": silence(1.0), "q1": say(CAPITAL_QUESTION, d / "q1.wav"), "gap1": silence(8.0),
             "q2": say("Please tell me a long story about a brave little dragon.", d / "q2.wav"),
             "gap2": silence(4.5), "barge_in": say("Wait, wait. Stop a moment please.", d / "bi.wav"),
             "tail": silence(7.0)}
    marks, t = {}, 0.0
    for name, p in parts.items():
        marks[name] = (t, t + p.size / 16000)
        t += p.size / 16000
    # the caller's words start voiced: a phone line carries 300-3400 Hz, so the "s" of a "Stop"
    # (4-8 kHz, 200 ms of flite's) would never reach the carrier, and the onset measured at 16 kHz
    # would count time no server could hear
    onset = speech_onset_s(parts["barge_in"])
    marks["barge_in_speech"] = marks["barge_in"][0] + onset
    from transport.audio import resample

    phone_band = resample(parts["barge_in"], 16000, 8000)
    assert speech_onset_s(phone_band, rate=8000) - onset < 0.03
    return np.concatenate(list(parts.values())), marks


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`duplex serve` with the Twilio endpoint and an AudioSocket port; calls run one at a time."""
    d = tmp_path_factory.mktemp("traces")
    sip_port = free_port()
    # the default LLM: the 135M test model's answers wander into French, which Whisper tiny.en
    # cannot transcribe back to its words
    with duplex_serve("--audiosocket", str(sip_port), "--trace-dir", str(d),
                      "--max-tokens", "300", "--system-prompt", STORYTELLER) as port:
        yield port, sip_port, d


def session_trace(trace_dir: Path, prefix: str, known: frozenset = frozenset()):
    """The events of the one session whose id starts with `prefix` (apart from the `known` trace
    files), once its trace is written."""
    from agent.tracing.export import load_events

    def found():
        return sorted(set(trace_dir.glob(f"{prefix}*.trace.json")) - known)

    wait_until(found, 30, every=0.2)
    found = found()
    assert len(found) == 1, found
    return load_events(str(found[0]))


@pytest.fixture(scope="module")
def phone_call(server, script):
    import websockets

    from transport.audio import resample

    port, _, trace_dir = server
    audio, marks = script

    async def talk() -> FakeProvider:
        async with websockets.connect(f"ws://127.0.0.1:{port}/twilio") as ws:
            twilio = FakeProvider(ws, peer("twilio"))
            await twilio.call(resample(audio, 16000, 8000))
            return twilio

    twilio = asyncio.run(talk())
    return twilio, marks, session_trace(trace_dir, "twilio")


def reply_text(events, turn: int) -> str:
    """The words of the turn's last LLM request: the reply, not a cancelled speculation."""
    t0 = max(e.ts_ns for e in events if e.stage == "llm" and e.name == "request" and e.turn == turn)
    return "".join(e.args["text"] for e in events
                   if e.stage == "llm" and e.name == "token" and e.turn == turn and e.ts_ns >= t0)


def assert_understood_and_answered(provider, marks: dict, events) -> None:
    """The question was recognised from phone audio, and the audio the provider played after it is
    the bot's answer, transcribed by Whisper. The transcription reads the bot's samples without the
    silence the provider filled in for want of audio (a chunk late under load leaves a gap that
    Whisper hears as a clause break: "The capital, a Francis Pairs."); the pacing has its own test,
    and the gaps are reported."""
    from asr.wer import cer

    finals = [e for e in events if e.stage == "asr" and e.name == "final" and e.args.get("text")]
    assert finals, "nothing the caller said was recognised"
    first = finals[0].args["text"].lower()
    assert "capital" in first and "france" in first, first  # phone audio in, decoded and resampled
    answer, gaps = provider.answer(marks["q1"][1], marks["q2"][0])
    answer = answer.astype(np.float32) / 32768
    assert answer.size and np.sqrt(np.mean(answer ** 2)) > 0.01, "the caller heard nothing after the question"
    reply = reply_text(events, finals[0].turn)
    heard = closest(hear_answer(answer, provider.rate, CAPITAL_QUESTION), reply)
    report_figure("telephony_answer", session=events[-1].session, gap_frames=gaps, reply=reply, heard=heard)
    assert cer([reply], [heard]) < 0.2, (reply, heard)  # letters: see tests/test_local_audio.py


def assert_context_is_what_was_heard(events) -> None:
    """The interrupted story's context keeps only what the caller heard: a strict prefix."""
    interrupted = [e for e in events if e.stage == "turn" and e.name == "interrupted"]
    assert interrupted, "speaking over the story did not interrupt it"
    turn = interrupted[0].turn
    reply, heard = reply_text(events, turn), interrupted[0].args["heard"]
    assert heard.split() and is_word_prefix(heard, reply, strict=True), (heard, reply)


def test_twilio_caller_is_understood_and_hears_the_answer(phone_call):
    twilio, marks, events = phone_call
    assert_understood_and_answered(twilio, marks, events)


def test_twilio_marks_tell_the_server_what_was_played(phone_call):
    twilio, marks, events = phone_call
    echoed = {int(x[1:]): t for t, k, x in twilio.log if k == "echo" and x.startswith("s")}
    traced = {e.args["chunk"] for e in events if e.stage == "client" and e.name == "playout_start"}
    assert echoed and traced <= set(echoed)
    # an echo still on the wire when the server sent `clear` is dropped with the cleared marks
    # (Twilio's echoes do not say which were reached and which were cleared); only those
    clears = [t for t, k, _ in twilio.log if k == "clear"]
    late = [cid for cid in set(echoed) - traced if not any(0 <= c - echoed[cid] < 1.0 for c in clears)]
    assert not late, late


def test_twilio_talking_over_the_bot_clears_twilios_buffer(phone_call):
    twilio, marks, events = phone_call
    clears = [t for t, k, _ in twilio.log if k == "clear"]
    assert clears, "speaking over the story did not clear Twilio's buffer"
    barge_start = marks["barge_in"][0]
    assert barge_start < clears[0] < barge_start + 1.5, (barge_start, clears)
    # the figure (not asserted: timings are benchmarks): from the start of the caller's speech
    # over the story to the clear reaching Twilio, and to the earpiece falling silent
    onset = marks["barge_in_speech"]
    loud = [np.abs(f).max() > 64 for f in twilio.played]
    first = int(onset / 0.02)
    silent_at = next((k for k in range(first, len(loud) - 25) if not any(loud[k:k + 25])), None)
    report_figure("barge_in_twilio", clear_ms=round((clears[0] - onset) * 1000),
                  earpiece_silent_ms=None if silent_at is None else round((silent_at * 0.02 - onset) * 1000),
                  bot_audible_at_onset=any(loud[max(0, first - 5):first + 1]))
    # nothing queued before the clear plays after it: marks echoed later name newer pieces only
    sent_before = {int(x[1:]) for t, k, x in twilio.log if k == "mark" and t <= clears[0]}
    played_after = {int(x[1:]) for t, k, x in twilio.log if k == "echo" and t > clears[0] and x.startswith("s")}
    assert not played_after & sent_before, sorted(played_after & sent_before)[:5]
    assert_context_is_what_was_heard(events)


class FakeAsterisk:
    """Asterisk's side of an AudioSocket call: the UUID, then the caller's audio as 20 ms slin
    frames at real-time pace; the bot's frames are played in arrival order on the call's clock."""

    rate = 8000

    def __init__(self):
        self.arrivals: list[tuple[float, np.ndarray]] = []  # (seconds since the call began, frame)

    async def call(self, port: int, caller_8k: np.ndarray) -> None:
        from transport.telephony.audiosocket import (
            HANGUP,
            UUID,
            FrameParser,
            encode_audio,
            encode_frame,
        )

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_frame(UUID, bytes(range(16))))
        writer.write(encode_frame(0x42, b"?") + encode_frame(0x10, b"\x00\x01\x02"))  # bad: skipped, logged
        t0 = time.perf_counter()

        async def read() -> None:
            parser = FrameParser()
            while data := await reader.read(4096):
                for f in parser.feed(data):
                    if f.kind == 0x10:
                        self.arrivals.append((time.perf_counter() - t0, np.frombuffer(f.payload, "<i2")))

        task = asyncio.create_task(read())
        pcm = (np.clip(caller_8k, -1, 1) * 32767).astype(np.int16)
        for k, i in enumerate(range(0, pcm.size - FRAME + 1, FRAME)):
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.perf_counter()))
            writer.write(encode_audio(pcm[i:i + FRAME]))
            await writer.drain()
        writer.write(encode_frame(HANGUP))
        await writer.drain()
        await asyncio.wait_for(task, 10)  # the server hangs up too
        writer.close()

    def answer(self, start_s: float, end_s: float) -> tuple[np.ndarray, int]:
        """The bot's frames that arrived between the two times, and how many 20 ms frames of the
        earpiece between them went without audio (each frame plays when it arrives, or after the
        one before it)."""
        arrived = [(t, f) for t, f in self.arrivals if start_s <= t < end_s]
        if not arrived:
            return np.zeros(0, np.int16), 0
        played_to, gaps = arrived[0][0], 0.0
        for t, frame in arrived:
            gaps += max(0.0, t - played_to)
            played_to = max(played_to, t) + frame.size / 8000
        return np.concatenate([f for _, f in arrived]), round(gaps / 0.02)


@pytest.fixture(scope="module")
def asterisk_call(server, script, phone_call):  # after the Twilio call: one call at a time
    from transport.audio import resample

    _, sip_port, trace_dir = server
    audio, marks = script
    asterisk = FakeAsterisk()
    asyncio.run(asterisk.call(sip_port, resample(audio, 16000, 8000)))
    return asterisk, marks, session_trace(trace_dir, "sip")


def test_asterisk_caller_is_understood_and_hears_the_answer(asterisk_call):
    asterisk, marks, events = asterisk_call
    assert_understood_and_answered(asterisk, marks, events)


def test_asterisk_gets_audio_at_real_time_pace(asterisk_call):
    """Asterisk buffers almost nothing: the reply must come 20 ms a frame, not in bursts."""
    asterisk, marks, events = asterisk_call
    answer = [t for t, _ in asterisk.arrivals if marks["q1"][1] < t < marks["q2"][0]]
    assert len(answer) > 25, "less than half a second of answer"
    span = answer[-1] - answer[0]
    assert span >= 0.9 * (len(answer) - 1) * 0.02, f"{len(answer)} frames in {span:.2f} s"
    # 10 frames in any 200 ms, plus at most the 5 (100 ms) the pacer sends at once to catch up after
    # a stall, plus one at the window's edge; unpaced audio would come 20+ at once (the 0.4 s lead)
    busiest = max(sum(1 for u in answer if t <= u < t + 0.2) for t in answer)
    assert busiest <= 16, f"{busiest} frames within 200 ms"


def test_asterisk_talking_over_the_bot_stops_its_audio(asterisk_call):
    asterisk, marks, events = asterisk_call
    barge_start = marks["barge_in"][0]
    story = [t for t, _ in asterisk.arrivals if marks["q2"][1] < t < barge_start + 2.0]
    assert story and story[0] < barge_start, "the story had not started when the caller spoke over it"
    stopped = max(t for t in story) if story else 0
    assert barge_start < stopped < barge_start + 1.5, (barge_start, stopped)
    assert_context_is_what_was_heard(events)


WIDEBAND = {"plivo": peer("plivo", "audio/x-l16", 16000), "vonage": peer("vonage", "audio/l16", 24000)}


@pytest.fixture(scope="module", params=list(WIDEBAND))
def wideband_call(request, server, script, asterisk_call):  # one call at a time
    """A Plivo stream in 16 kHz linear PCM (checkpoints, playAudio, clearAudio; no stop), then a
    Vonage one at 24 kHz (binary 20 ms frames, notify, clear; no stop)."""
    import websockets

    from transport.audio import resample

    port, _, trace_dir = server
    audio, marks = script
    far = WIDEBAND[request.param]

    async def talk() -> FakeProvider:
        async with websockets.connect(f"ws://127.0.0.1:{port}/{far.name}") as ws:
            provider = FakeProvider(ws, far)
            await provider.call(resample(audio, 16000, far.rate))
            return provider

    provider = asyncio.run(talk())
    return provider, marks, session_trace(trace_dir, far.name)


def test_wideband_caller_is_understood_and_hears_the_answer(wideband_call):
    provider, marks, events = wideband_call
    assert_understood_and_answered(provider, marks, events)


def test_wideband_talking_over_the_bot_clears_the_providers_buffer(wideband_call):
    provider, marks, events = wideband_call
    clears = [t for t, k, _ in provider.log if k == "clear"]
    assert clears, "speaking over the story did not clear the provider's buffer"
    assert marks["barge_in"][0] < clears[0] < marks["barge_in"][0] + 1.5, (marks["barge_in"], clears)
    echoed = {int(x[1:]) for _, k, x in provider.log if k == "echo" and x.startswith("s")}
    traced = {e.args["chunk"] for e in events if e.stage == "client" and e.name == "playout_start"}
    assert echoed and traced <= echoed  # only marks the provider reached count as played
    assert_context_is_what_was_heard(events)


@pytest.fixture(scope="module")
def backchannel_call(server, tmp_path_factory, phone_call):  # after the other calls (file order)
    """A Twilio call: the caller asks for a story and says only "Mm-hmm." over it."""
    import websockets

    from transport.audio import resample

    port, _, trace_dir = server
    d = tmp_path_factory.mktemp("backchannel")
    parts = {"lead": silence(1.0), "q": say("Please tell me a long story about a brave little dragon.", d / "q.wav"),
             "gap": silence(5.0), "mm": say("Mm-hmm.", d / "mm.wav"), "tail": silence(7.0)}
    marks, t = {}, 0.0
    for name, p in parts.items():
        marks[name] = (t, t + p.size / 16000)
        t += p.size / 16000
    marks["mm_speech"] = marks["mm"][0] + speech_onset_s(parts["mm"])
    known = frozenset(trace_dir.glob("twilio*.trace.json"))

    async def talk() -> FakeProvider:
        async with websockets.connect(f"ws://127.0.0.1:{port}/twilio") as ws:
            twilio = FakeProvider(ws, peer("twilio"))
            await twilio.call(resample(np.concatenate(list(parts.values())), 16000, 8000))
            return twilio

    twilio = asyncio.run(talk())
    return twilio, marks, session_trace(trace_dir, "twilio", known)


def heard_over(events) -> list[str]:
    """What the recognizer wrote for the speech over the story (its partials and final)."""
    from agent.tracing.trace import Ev, Stage

    return [e.args.get("text") for e in events if e.stage == Stage.ASR and e.name in (Ev.PARTIAL, Ev.FINAL) and e.turn == 1]


def test_twilio_backchannel_pauses_the_bot_and_it_resumes(backchannel_call):
    """"Mm-hmm." over the story: Twilio's buffer is cleared at once (the bot yields), no words
    come, and the story goes on from where the caller's earpiece stopped."""
    twilio, marks, events = backchannel_call
    from agent.tracing.trace import CUT_BY_WORDS, Ev, Stage

    turn = [e for e in events if e.stage == Stage.TURN]
    names = [e.name for e in turn]
    assert Ev.REPLY_PAUSED in names, "the bot did not yield to the speech over it"
    assert Ev.RESUME in names, f"the story did not resume after a wordless interruption: {heard_over(events)}"
    cuts = [e.args for e in turn if e.name == Ev.INTERRUPTED and e.args.get("why") == CUT_BY_WORDS]
    assert not cuts, f"a backchannel cut the story: {cuts}, heard {heard_over(events)}"
    clears = [t for t, k, _ in twilio.log if k == "clear"]
    assert clears and marks["mm"][0] < clears[0] < marks["mm"][1] + 1.5, (marks["mm"], clears)
    resumed = [t for t, k, _ in twilio.log if k == "media" and t > clears[0]]
    assert resumed, "no audio reached Twilio after the pause"
    earpiece = np.concatenate(twilio.played).astype(np.float32) / 32768
    after = earpiece[int((resumed[0] + 0.5) * 8000):int((resumed[0] + 2.5) * 8000)]
    assert after.size and np.sqrt(np.mean(after ** 2)) > 0.01, "the caller heard nothing of the resumed story"
    report_figure("backchannel_twilio", clear_ms=round((clears[0] - marks["mm_speech"]) * 1000),
                  resumed_after_speech_end_ms=round((resumed[0] - marks["mm"][1]) * 1000))
