"""The WebRTC transport over real loopback sockets, wired as `duplex serve` wires it: an
independent aiortc peer (tests/webrtc_peer.py, not the page) posts an offer to /webrtc/offer,
speaks into its mic track and hears the reply track. Every peer, ours and the server's, gathers
127.0.0.1 only (--ice-host), and the selected candidate pairs prove it. Then bad offers, a
barge-in that stops the track at once, and a peer that vanishes without closing."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.rtp import RtpPacket
from doubles import burst
from helpers import CAPITAL_QUESTION, await_until, closest, flite_available, hear_answer, say, silence
from test_serving import doubles, get, serving
from webrtc_peer import connect, post

from transport.web.client import LEVEL_STEP_S, levels_db
from transport.webrtc.ice import host_addresses, selected_pairs
from transport.webrtc.jitter import AudioJitterBuffer, use_low_latency_audio
from transport.webrtc.track import FRAME, ReplyAudioTrack
from transport.webrtc.transport import WebRTCTransport

RATE = 16000
LOOPBACK = ["127.0.0.1"]


pytestmark = pytest.mark.usefixtures("virtual_clock")


def question() -> np.ndarray:
    return np.concatenate([silence(0.3), burst(1.0, seed=1), silence(1.5)])


def base(s) -> str:
    return f"http://127.0.0.1:{s.port}"


def innermost(transport):
    """The transport under the server's pass-through wrappers (metrics, errors, holding limits)."""
    while (inner := getattr(transport, "inner", None)) is not None:
        transport = inner
    return transport


def server_transports(s) -> list[WebRTCTransport]:
    return [t for session, _ in s.server.sessions.values()
            if isinstance(t := innermost(session.transport), WebRTCTransport)]


def loud_s(pcm: np.ndarray, rate: int = 48000, level: float = 0.02) -> float:
    """Seconds of 10 ms windows louder than `level` (RMS)."""
    win = rate // 100
    n = pcm.size // win
    if not n:
        return 0.0
    rms = np.sqrt((pcm[:n * win].reshape(n, win) ** 2).mean(axis=1))
    return float((rms > level).sum()) / 100


async def test_a_turn_over_webrtc_on_loopback_only():
    async with serving(ice_hosts=LOOPBACK) as s:
        peer = await connect(base(s), question())
        try:
            assert await await_until(lambda: any(e["type"] == "bot_done" for e in peer.events), 30), \
                [e["type"] for e in peer.events]
            assert await await_until(lambda: loud_s(peer.reply_pcm()) > 0.3, 10), "no reply audio came"
            ready = next(e for e in peer.events if e["type"] == "ready")
            assert ready["transport"] == "webrtc" and ready["played_marks"] == "rtp"
            # the reply's pieces were announced as handed to RTP, and came back as Played marks
            sent = {e["id"] for e in peer.events if e["type"] == "audio" and e["event"] == "start"}
            assert sent
            (inner,) = server_transports(s)
            # both ends of both peers' selected pairs are 127.0.0.1: nothing went elsewhere
            for pc in (peer.pc, inner.pc):
                pairs = selected_pairs(pc)
                assert pairs and all(loc[0] == "127.0.0.1" and rem[0] == "127.0.0.1" for loc, rem in pairs), pairs
            answer_hosts = {line.split()[4] for line in inner.pc.localDescription.sdp.splitlines()
                            if line.startswith("a=candidate:")}
            assert answer_hosts == {"127.0.0.1"}, answer_hosts
            # the server's mic goes through our jitter buffer (no 80 ms of aiortc's prefetch)
            jb = inner.pc.getTransceivers()[0].receiver._RTCRtpReceiver__jitter_buffer
            assert isinstance(jb, AudioJitterBuffer) and jb.lost + jb.dropped < 5, type(jb).__name__
            assert s.admission.live == 1
        finally:
            await peer.close()
        assert await await_until(lambda: s.admission.live == 0, 10)


async def test_a_barge_in_stops_the_reply_track_at_once():
    long_reply = " ".join(["The dragon flew over the hills and far away."] * 12)
    async with serving(ice_hosts=LOOPBACK, models=doubles(long_reply)) as s:
        speech = np.concatenate([question(), silence(3.0), burst(1.0, seed=2), silence(3.0)])
        peer = await connect(base(s), speech)
        try:
            assert await await_until(lambda: any(e["type"] == "clear" for e in peer.events), 40), \
                [e["type"] for e in peer.events]
            # when the clear reaches the peer, what the server held for the track is gone: what
            # still arrives is only what was already on the wire
            t_clear = next(t for t, e in zip(peer.event_times, peer.events) if e["type"] == "clear")
            assert await await_until(lambda: peer.audio and peer.audio[-1][0] > t_clear + 1.0, 10)
            after = np.concatenate([a for t, a in peer.audio if t > t_clear] or [np.zeros(0)])
            late = loud_s(after)
            # what the peer still decodes after the clear came: the frames on the wire and in its
            # jitter buffer (transport/webrtc/jitter.py: none on a clean link, at most 3); the rest
            # of the reply, seconds, never leaves the server
            print(f"reply audio the peer decoded after the clear arrived: {late * 1000:.0f} ms")
            assert late <= 0.25, f"{late:.2f} s of the interrupted reply still arrived after the clear"
            assert any(e["type"] == "interrupted" for e in peer.events)
            (inner,) = server_transports(s)
            assert inner.cleared_samples > 0  # the track held audio, and dropped it
        finally:
            await peer.close()


async def test_bad_offers_get_clear_4xx_and_the_server_goes_on():
    async with serving(ice_hosts=LOOPBACK) as s:
        url = base(s) + "/webrtc/offer"
        cases = {
            "wrong content type": (post, (url, b'{"sdp": "v=0", "type": "offer"}', "text/plain"), 415),
            "malformed JSON": (post, (url, b'{"sdp": '), 400),
            "not an offer": (post, (url, b'{"sdp": "v=0", "type": "answer"}'), 400),
            "unreadable SDP": (post, (url, json.dumps({"sdp": "hello", "type": "offer"}).encode()), 400),
            "oversized body": (post, (url, b'{"sdp": "' + b"a" * 100_000 + b'", "type": "offer"}'), 413),
        }
        no_audio = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        no_audio.createDataChannel("events")
        with host_addresses(LOOPBACK):
            await no_audio.setLocalDescription(await no_audio.createOffer())
        await no_audio.close()
        cases["SDP without audio"] = (post, (url, json.dumps(
            {"sdp": no_audio.localDescription.sdp, "type": "offer"}).encode()), 400)
        for name, (fn, args, want) in cases.items():
            status, text = await asyncio.to_thread(fn, *args)
            assert status == want, (name, status, text)
            assert text.strip(), name
            print(f"{name}: {status} {text.strip()[:100]}")
        status, _, text = await get(s.port, "/webrtc/offer")
        assert status == 405 and "POST" in text
        assert s.admission.live == 0
        peer = await connect(base(s), question())  # and a good offer still works
        try:
            assert await await_until(lambda: any(e["type"] == "bot_done" for e in peer.events), 30)
        finally:
            await peer.close()


async def test_the_offer_obeys_the_token_the_origin_and_the_session_cap():
    async with serving(ice_hosts=LOOPBACK, token="s3cret", max_sessions=1) as s:
        url = base(s) + "/webrtc/offer"
        body = b'{"sdp": "v=0", "type": "offer"}'
        status, text = await asyncio.to_thread(post, url, body)
        assert status == 401 and "token" in text
        status, _ = await asyncio.to_thread(post, url, body, "application/json",
                                            {"Authorization": "Bearer s3cret", "Origin": "https://evil.example"})
        assert status == 403
        status, _ = await asyncio.to_thread(post, url + "?token=s3cret", body)
        assert status == 400  # let in, and then the bad SDP is refused
        first = await connect(base(s), question(), token="s3cret")
        try:
            assert await await_until(lambda: s.admission.live == 1, 10)
            with pytest.raises(RuntimeError, match="503"):
                await connect(base(s), question(), token="s3cret")
        finally:
            await first.close()


async def settled_tasks(timeout: float = 10.0) -> set[asyncio.Task]:
    """The loop's tasks once the server has finished starting (no change for 0.5 s)."""
    deadline = asyncio.get_running_loop().time() + timeout
    tasks = asyncio.all_tasks()
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.5)
        now = asyncio.all_tasks()
        if now == tasks:
            break
        tasks = now
    return tasks - {asyncio.current_task()}


async def test_a_vanished_peer_releases_every_task_and_track_within_10s(virtual_clock):
    async with serving(ice_hosts=LOOPBACK) as s:
        before = await settled_tasks()
        # its peer is another process: the clock keeps the real pace until the peer is gone
        with virtual_clock.real_time() if virtual_clock else contextlib.nullcontext():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).with_name("webrtc_peer.py")), base(s),
                stdout=asyncio.subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 30)
                assert line.strip() == b"connected"
                assert await await_until(lambda: s.admission.live == 1 and len(s.server.sessions) == 1, 10)
                during = asyncio.all_tasks() - before
                assert during
                (inner,) = server_transports(s)
            finally:
                proc.send_signal(signal.SIGKILL)  # no close, no DTLS alert, no SCTP abort: gone
                await proc.wait()
        t0 = asyncio.get_running_loop().time()
        assert await await_until(lambda: s.admission.live == 0 and not s.server.sessions, 10), "still live"
        assert await await_until(lambda: asyncio.all_tasks() - {asyncio.current_task()} <= before, 10 - (
            asyncio.get_running_loop().time() - t0)), [repr(t.get_coro()) for t in asyncio.all_tasks() - before]
        print(f"released the conversation's {len(during)} tasks in {asyncio.get_running_loop().time() - t0:.1f} s")
        assert inner.track.readyState == "ended" and inner.pc.connectionState == "closed"
        assert inner.abnormal_end() and "nothing from the peer" in inner.abnormal_end()


async def test_the_reply_track_paces_real_time_and_clear_drops_what_it_holds():
    track = ReplyAudioTrack()
    track.push(7, np.full(48000, 1000, np.int16))  # 1 s
    frames = [await track._next_frame() for _ in range(5)]
    assert all(f.samples == FRAME and f.sample_rate == 48000 for f in frames)
    assert [f.pts for f in frames] == [i * FRAME for i in range(5)]
    assert track.clear() == 48000 - 5 * FRAME
    nxt = await track._next_frame()
    assert not np.frombuffer(bytes(nxt.planes[0]), np.int16)[:FRAME].any(), "audio after the clear"
    with pytest.raises(OverflowError):
        track.push(8, np.zeros(48000 * 11, np.int16))  # bounded: 10 s at most


async def test_the_reply_track_hands_the_sender_opus_packets_encoded_off_the_loop():
    from aiortc.codecs.opus import OpusDecoder
    from aiortc.jitterbuffer import JitterFrame

    track = ReplyAudioTrack()
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(48000) / 48000)).astype(np.int16)
    track.push(1, tone)
    loop_thread = threading.get_ident()
    threads = set()
    encode = track._encoder.encode
    track._encoder.encode = lambda *a: (threads.add(threading.get_ident()), encode(*a))[1]
    packets = [await track.recv() for _ in range(10)]
    assert [p.pts for p in packets] == [i * FRAME for i in range(10)]
    assert threads and loop_thread not in threads, "Opus was encoded on the event loop"
    decoder = OpusDecoder()
    pcm = np.concatenate([f.to_ndarray().reshape(-1, 2)[:, 0] for p in packets
                          for f in decoder.decode(JitterFrame(bytes(p), p.pts))])
    assert pcm.size == 10 * FRAME
    assert np.sqrt(np.mean(pcm[FRAME:].astype(np.float64) ** 2)) > 2000  # the tone, through Opus
    track.stop()


def without_long_silences(pcm: np.ndarray, rate: int, keep_s: float = 0.3) -> np.ndarray:
    """`pcm` (float) with every run of silent 10 ms steps (50 dB below its loudest) cut to `keep_s`."""
    step = round(LEVEL_STEP_S * rate)
    levels = levels_db(pcm * 32768.0, rate)
    loudest = max(levels, default=0.0)
    kept, run = [], 0
    for i, level in enumerate(levels):
        run = run + 1 if level < loudest - 50.0 else 0
        if run * LEVEL_STEP_S <= keep_s + 1e-9:
            kept.append(pcm[i * step:(i + 1) * step])
    return np.concatenate(kept) if kept else pcm[:0]


def test_long_silences_are_cut_and_the_sound_kept():
    rate = 48000
    tone = np.sin(np.arange(rate // 2) / 5).astype(np.float32)
    pcm = np.concatenate([tone, np.zeros(3 * rate, np.float32), tone, np.zeros(rate // 10, np.float32)])
    out = without_long_silences(pcm, rate)
    assert out.size == 2 * tone.size + int(0.3 * rate) + rate // 10
    assert np.array_equal(out[:tone.size], tone) and np.array_equal(out[tone.size + int(0.3 * rate):][:tone.size], tone)


def reply_handed_off(peer, track: ReplyAudioTrack, quiet_s: float = 0.5) -> bool:
    """All of the reply has left the server: the session finished it (bot_done, sent once all
    its audio went to the transport), the track holds none of it, and the last piece was handed
    to RTP `quiet_s` ago (the peer's jitter buffer has given it out since)."""
    if not any(e["type"] == "bot_done" for e in peer.events) or track.playback.queued:
        return False
    last = max((t for t, e in zip(peer.event_times, peer.events) if e["type"] == "audio"), default=0.0)
    return time.perf_counter() - last > quiet_s


@pytest.mark.models
@pytest.mark.timeout(300)
@pytest.mark.skipif(not flite_available(), reason="flite is missing")
async def test_a_spoken_question_gets_a_spoken_reply_that_whisper_transcribes(tmp_path):
    from agent.conversation.models import ModelChoice, load_models
    from asr.wer import cer

    models = await asyncio.to_thread(load_models, ModelChoice(llm="smollm2-135m"))
    spoken = np.concatenate([silence(0.5), say(CAPITAL_QUESTION, tmp_path / "q.wav"), silence(1.5)])
    async with serving(ice_hosts=LOOPBACK, models=models) as s:
        peer = await connect(base(s), spoken)
        try:
            assert await await_until(lambda: any(e["type"] in ("bot_done", "error") for e in peer.events), 120), \
                [e["type"] for e in peer.events]
            (inner,) = server_transports(s)
            # then the last of the reply has come through the peer's jitter buffer
            assert await await_until(lambda: reply_handed_off(peer, inner.track), 60), \
                " ".join(f"{e['type']}:{e.get('state') or e.get('event')}" for e in peer.events[-40:])
            late = inner.track.late_s
        finally:
            await peer.close()
    done = next(e for e in peer.events if e["type"] == "bot_done")
    reply = done["text"]
    # what is checked is the audio's content: on a loaded machine the reply may stall between
    # its first phrase and the rest for seconds, a hole Whisper reads as a sentence's end
    heard_audio = without_long_silences(peer.reply_pcm(), 48000)
    heard = closest(hear_answer(heard_audio, 48000, CAPITAL_QUESTION), reply)
    score = cer([reply], [heard])
    latency = next((e for e in peer.events if e["type"] == "latency"), {})
    print(f"reply {reply!r}, heard {heard!r}, CER {score:.3f}, server voice-to-voice "
          f"{latency.get('voice_to_voice_ms')} ms, the track's latest frame {late * 1000:.0f} ms late")
    assert score < 0.2


def test_the_body_splitter_hands_websockets_the_head_and_keeps_the_body():
    from transport.web.request_body import BodySplitter

    get_request = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"
    sp = BodySplitter()
    assert sp.feed(get_request[:10]) == b"" and sp.feed(get_request[10:]) == get_request
    assert sp.feed(b"frame bytes") == b"frame bytes"  # a WebSocket goes on untouched

    head = b"POST /webrtc/offer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
    sp = BodySplitter()
    assert sp.feed(head + b"hello") == b""  # the body is not all there yet
    out = sp.feed(b" world")
    assert out == b"POST /webrtc/offer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
    assert sp.body == b"hello world" and sp.body_error is None
    assert sp.feed(b"more") == b""  # nothing after the body reaches websockets

    for headers, status in ((b"Transfer-Encoding: chunked\r\n", 411), (b"Content-Length: 99999999\r\n", 413),
                            (b"Content-Length: -1\r\n", 400), (b"Content-Length: 1\r\nContent-Length: 2\r\n", 400)):
        sp = BodySplitter()
        out = sp.feed(b"POST /webrtc/offer HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert out.startswith(b"POST /webrtc/offer") and b"Content-Length" not in out
        assert sp.body_error is not None and sp.body_error[0] == status, (headers, sp.body_error)


class StalledChannel:
    """A data channel whose peer stopped reading: aiortc's buffer for it is over any limit."""

    label = "events"

    def __init__(self, state: str = "open", buffered: int = 1 << 30):
        self.readyState, self.bufferedAmount, self.sent = state, buffered, []

    def on(self, *_):
        return None

    def send(self, text: str) -> None:
        self.sent.append(text)


async def test_a_peer_that_stops_reading_costs_the_server_no_memory():
    from transport.events import PartialTranscript

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    transport = WebRTCTransport(pc)
    try:
        waiting = StalledChannel(state="connecting")
        transport.attach_channel(waiting)
        for i in range(1000):  # before the channel opens: only the latest 64 wait for it
            await transport.send_event(PartialTranscript(f"word {i}"))
        assert len(transport._pending) == 64 and not waiting.sent
        transport._channel = stalled = StalledChannel()
        for i in range(10_000):
            await transport.send_event(PartialTranscript(f"word {i}"))
        assert not stalled.sent and transport.dropped_events == 10_000
        for _ in range(300):  # a peer flooding us with messages the session has not read yet
            transport._on_message('{"type": "metrics", "turn": 0, "mouth_to_ear_ms": 1}')
        assert len(transport._control) == 256 and transport.dropped_events == 10_044
    finally:
        await transport.close()


def jitter_lags(order, **options):
    """Feed packets in `order` (sequence numbers, which wrap at 2**16) to an AudioJitterBuffer:
    the buffer, the frames it gave out, and each one's lag (packets that arrived after it)."""
    jb = AudioJitterBuffer(**options)
    out, lags, newest = [], [], None
    for seq in order:
        packet = RtpPacket(sequence_number=seq % 65536, timestamp=seq * FRAME % 2**32)
        packet._data = seq.to_bytes(4, "big")
        newest = seq if newest is None else max(newest, seq)
        _, frame = jb.add(packet)
        if frame is not None:
            got = int.from_bytes(frame.data, "big")
            out.append(got)
            lags.append(newest - got)
    return jb, out, lags


def test_the_mic_jitter_buffer_gives_each_packet_out_at_once_and_caps_its_lag():
    # a clean link, across the sequence numbers' wrap: every packet out as it comes
    jb, out, lags = jitter_lags(range(65500, 65600))
    assert out == list(range(65500, 65600)) and set(lags) == {0}
    # one packet lost: given up after two more came; one frame of lag left, not 14 (aiortc's)
    kept = [s for s in range(100) if s != 30]
    jb, out, lags = jitter_lags(kept)
    assert jb.lost == 1 and out == kept[:len(out)] and len(out) >= len(kept) - 1  # the last one waits
    assert max(lags) <= 2 and lags[-1] <= 1, lags
    # reordering by one: nothing lost, in order
    order = list(range(100))
    order[40], order[41] = 41, 40
    jb, out, lags = jitter_lags(order)
    assert out == list(range(len(out))) and len(out) >= 99 and jb.lost == 0
    # a burst (five packets held up, then all at once) and duplicates: the lag stays capped
    order = list(range(50)) + [49, 48] + [50, 51, 57, 56, 55, 54, 53, 52] + list(range(58, 100))
    jb, out, lags = jitter_lags(order)
    assert max(lags) <= jb.max_lag and out == sorted(set(out)), (lags, out)
    assert len(out) >= 95, out  # a frame or two dropped to catch up, once
    with pytest.raises(ValueError):
        AudioJitterBuffer(max_wait=5, max_lag=3)


async def test_the_low_latency_jitter_buffer_is_installed_on_aiortc_receivers():
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio")
        pc.createDataChannel("events")
        # fails if a later aiortc has moved its receiver's buffer (then +80 ms on every mic frame)
        assert use_low_latency_audio(pc) == 1
        assert isinstance(pc.getTransceivers()[0].receiver._RTCRtpReceiver__jitter_buffer, AudioJitterBuffer)
    finally:
        await pc.close()
