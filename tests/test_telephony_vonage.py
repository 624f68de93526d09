"""Vonage Voice API WebSockets: the wire format against pipecat's own VonageFrameSerializer, a
whole call in messages as Vonage documents them (`media_stream_peers`), at every rate, and
fuzzed bad input."""
import asyncio
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_stream_peers import peer

from transport.base import AudioIn, ClientEvent, Played, ProtocolError
from transport.telephony.vonage import VonageCall, audio_frames, content_type_rate, parse_text


def _pipecat_vonage(rate: int):
    from types import SimpleNamespace

    from pipecat.serializers.vonage import VonageFrameSerializer

    ser = VonageFrameSerializer(VonageFrameSerializer.InputParams(vonage_sample_rate=rate, sample_rate=rate))
    asyncio.run(ser.setup(SimpleNamespace(audio_in_sample_rate=rate)))
    return ser


@pytest.mark.parametrize("rate", [8000, 16000])
def test_wire_format_matches_pipecats_vonage_serializer(rate):
    from pipecat.frames.frames import InterruptionFrame, OutputAudioRawFrame

    ser = _pipecat_vonage(rate)
    far = peer("vonage", rate=rate)
    call = VonageCall()
    call.receive(far.start())
    for seed in range(3):
        frame = np.random.default_rng(seed).integers(-20000, 20000, rate // 50).astype(np.int16).tobytes()
        theirs = np.frombuffer(asyncio.run(ser.deserialize(frame)).audio, np.int16)
        assert np.array_equal(np.round(call.receive(frame).pcm * 32768).astype(np.int16), theirs)
    pcm = (np.sin(np.arange(rate // 10) / 7.0) * 12000).astype(np.int16)  # a 100 ms piece
    theirs = asyncio.run(ser.serialize(OutputAudioRawFrame(pcm.tobytes(), rate, 1)))
    ours = call.audio(1, pcm)
    assert b"".join(m for m in ours if isinstance(m, bytes)) == theirs  # the same audio, in 20 ms frames
    assert [json.loads(m) for m in call.clear()] == [json.loads(asyncio.run(ser.serialize(InterruptionFrame())))]


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
def test_a_call_end_to_end_in_messages(rate):
    far = peer("vonage", rate=rate)
    call = VonageCall()
    assert call.audio(1, np.zeros(80, np.int16)) == [] and call.dropped_audio == 1  # no stream yet
    with pytest.raises(ProtocolError) as e:
        call.receive(far.media(b"\x00\x00" * (rate // 50)))
    assert e.value.code == "no_start"
    ev = call.receive(far.start({"caller-id": "447700900123", "uuid": "63f61863"}))
    assert ev == ClientEvent("call_start", {"param_caller-id": "447700900123", "param_uuid": "63f61863"})
    assert (call.rate, call.stream_sid) == (rate, "63f61863")
    pcm = (np.sin(np.arange(rate // 50) / 3.0) * 20000).astype(np.int16)
    ev = call.receive(far.media(pcm.astype("<i2").tobytes()))
    assert isinstance(ev, AudioIn) and ev.sample_rate == rate
    assert np.array_equal(np.round(ev.pcm * 32768).astype(np.int16), pcm)
    reply = (np.cos(np.arange(rate // 10 + 7) / 5.0) * 9000).astype(np.int16)  # 100 ms and a bit
    read = [far.read(m) for m in call.audio(7, reply)]  # checks every frame is exactly 20 ms
    assert [k for k, _ in read] == ["mark"] + ["audio"] * 6 + ["mark"]
    sent = np.frombuffer(b"".join(x for k, x in read if k == "audio"), "<i2")
    assert np.array_equal(sent[:reply.size], reply) and not sent[reply.size:].any()  # padded with silence
    start, end = read[0][1], read[-1][1]
    assert call.receive(far.echo(start), now=2.0) == Played(7, "start", 2.0)
    assert call.receive(far.echo(end), now=2.1) == Played(7, "end", 2.1)
    assert call.receive(far.echo(end)) is None
    assert call.receive(far.dtmf("#")) == ClientEvent("dtmf", {"digit": "#"})
    read = [far.read(m) for m in call.audio(8, reply)]
    assert [far.read(m) for m in call.clear()] == [("clear", None)]
    assert call.receive(far.cleared()) is None
    assert call.receive(far.echo(read[0][1])) is None  # cleared: never counts as played
    # a notify that is not one of ours means nothing
    assert call.receive(json.dumps({"event": "websocket:notify", "payload": {"other": 1}})) is None


def test_audio_frames_are_exactly_20_ms():
    for n in (0, 1, 319, 320, 321, 1600):
        frames = audio_frames(np.ones(n, np.int16), 16000)
        assert all(len(f) == 640 for f in frames) and len(frames) == -(-n // 320)


@pytest.mark.parametrize("value, rate", [("audio/l16;rate=16000", 16000), ("audio/L16; rate=8000", 8000),
                                         ("audio/l16;rate=24000", 24000)])
def test_content_types_we_speak(value, rate):
    assert content_type_rate(value) == rate


@pytest.mark.parametrize("message, code", [
    ("{not json", "bad_json"),
    (json.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=44100"}), "unsupported_format"),
    (json.dumps({"event": "websocket:connected", "content-type": "audio/pcmu"}), "unsupported_format"),
    (json.dumps({"event": "websocket:connected"}), "unsupported_format"),
    (json.dumps({"event": "websocket:dtmf", "digit": "55"}), "bad_message"),
    (json.dumps({"event": "websocket:notify", "payload": "s1"}), "bad_message"),
    (json.dumps({"event": "websocket:hangup"}), "unknown_event"),
    ("x" * 20000, "frame_too_large"),
    ('{"event": "websocket:dtmf", "digit": "5", "duration": ' + "9" * 5000 + "}", "bad_json"),  # found by
    # scripts/fuzz_sockets.py: more digits than Python converts raised a plain ValueError, ending the call
])
def test_bad_messages_say_what_is_wrong(message, code):
    with pytest.raises(ProtocolError) as e:
        parse_text(message)
    assert e.value.code == code


@pytest.mark.parametrize("frame", [b"\x00" * 641, b"\x00" * 48002])
def test_bad_audio_frames_are_errors(frame):
    call = VonageCall()
    call.receive(peer("vonage").start())
    with pytest.raises(ProtocolError) as e:
        call.receive(frame)
    assert e.value.code == "bad_audio"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(event=st.sampled_from(["websocket:connected", "websocket:dtmf", "websocket:notify", "websocket:cleared", "x"]),
       body=st.dictionaries(st.sampled_from(["content-type", "digit", "dtmf", "payload", "uuid", "event"]),
                            json_values, max_size=4),
       audio=st.binary(max_size=64))
def test_fuzzed_messages_give_events_or_protocol_errors(event, body, audio):
    call = VonageCall()
    for message in (json.dumps({"event": event, **body}), audio, peer("vonage").start(), audio,
                    json.dumps({"event": event, **body})):
        try:
            call.receive(message)
        except ProtocolError:
            pass
