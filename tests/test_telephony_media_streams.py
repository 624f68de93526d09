"""Twilio-style media streams (Twilio, Telnyx): G.711 against audioop (what pipecat uses), the
wire formats against pipecat's own Twilio and Telnyx serializers, mark bookkeeping, and fuzzed
bad input."""
import asyncio
import base64
import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.base import AudioIn, ClientEvent, Played, ProtocolError
from transport.telephony.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from transport.telephony.media_streams import (
    MAX_PENDING_MARKS, TELNYX, TWILIO, CallEnded, MediaStreamCall, clear_message, media_message, parse_message)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # stdlib up to 3.12: the G.711 everyone else uses

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"


def start_message(encoding="audio/x-mulaw", rate=8000):
    return json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": SID,
                       "start": {"streamSid": SID, "accountSid": "AC1", "callSid": "CA1", "tracks": ["inbound"],
                                 "customParameters": {"caller": "+15550100"},
                                 "mediaFormat": {"encoding": encoding, "sampleRate": rate, "channels": 1}}})


def inbound_media(payload: bytes, track="inbound") -> str:
    return json.dumps({"event": "media", "sequenceNumber": "3", "streamSid": SID,
                       "media": {"track": track, "chunk": "1", "timestamp": "5",
                                 "payload": base64.b64encode(payload).decode()}})


def test_g711_is_bit_exact_with_audioop_for_every_sample_and_code():
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    assert ulaw_encode(pcm) == audioop.lin2ulaw(pcm.tobytes(), 2)
    assert alaw_encode(pcm) == audioop.lin2alaw(pcm.tobytes(), 2)
    codes = bytes(range(256))
    assert ulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert alaw_decode(codes).tobytes() == audioop.alaw2lin(codes, 2)


def _pipecat_serializer():
    from types import SimpleNamespace

    from pipecat.serializers.twilio import TwilioFrameSerializer

    params = TwilioFrameSerializer.InputParams(sample_rate=8000, auto_hang_up=False)
    ser = TwilioFrameSerializer(SID, params=params)
    asyncio.run(ser.setup(SimpleNamespace(audio_in_sample_rate=8000)))  # only the rate is read
    return ser


def test_we_read_twilio_media_as_pipecats_serializer_does():
    ser = _pipecat_serializer()
    rng = np.random.default_rng(0)
    call = MediaStreamCall()
    call.receive(start_message())
    for _ in range(5):
        payload = rng.integers(0, 256, 160, dtype=np.uint8).tobytes()
        msg = inbound_media(payload)
        theirs = np.frombuffer(asyncio.run(ser.deserialize(msg)).audio, dtype=np.int16)
        ours = call.receive(msg)
        assert isinstance(ours, AudioIn) and ours.sample_rate == 8000
        assert np.array_equal(np.round(ours.pcm * 32768).astype(np.int16), theirs)


def test_we_write_media_and_clear_as_pipecats_serializer_does():
    from pipecat.frames.frames import InterruptionFrame, OutputAudioRawFrame

    ser = _pipecat_serializer()
    pcm = (np.sin(np.arange(800) / 7.0) * 12000).astype(np.int16)
    theirs = json.loads(asyncio.run(ser.serialize(OutputAudioRawFrame(pcm.tobytes(), 8000, 1))))
    assert json.loads(media_message(SID, ulaw_encode(pcm))) == theirs
    assert json.loads(clear_message(SID)) == json.loads(asyncio.run(ser.serialize(InterruptionFrame())))


TELNYX_ID = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"


def telnyx_start_message():
    """The start frame as Telnyx's Media Streaming reference shows it."""
    return json.dumps({"event": "start", "sequence_number": "1", "stream_id": TELNYX_ID,
                       "start": {"user_id": "3E6F995F-85F7-4705-9741-53B116D28237", "call_control_id": "v2:T02llQ",
                                 "call_session_id": "ff55a038", "from": "+13122010094", "to": "+13122123456",
                                 "custom_parameters": {"caller": "+15550100"},
                                 "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}})


DIALECTS = {"twilio": (TWILIO, start_message, SID, "CA1"), "telnyx": (TELNYX, telnyx_start_message, TELNYX_ID, "v2:T02llQ")}


@pytest.mark.parametrize("name", DIALECTS)
def test_a_call_end_to_end_in_messages(name):
    dialect, start_msg, sid, call_id = DIALECTS[name]
    call = MediaStreamCall(dialect)
    assert call.receive(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) is None
    assert call.audio(1, np.zeros(80, np.int16)) == [] and call.dropped_audio == 1  # no stream yet
    ev = call.receive(start_msg())
    assert ev == ClientEvent("call_start", {"stream_sid": sid, "call_sid": call_id, "param_caller": "+15550100"})
    pcm = np.array([0, 1000, -1000, 32767], np.int16)
    ev = call.receive(inbound_media(ulaw_encode(pcm)))
    assert np.allclose(ev.pcm * 32768, ulaw_decode(ulaw_encode(pcm)))
    assert call.receive(inbound_media(b"\xff" * 160, track="outbound")) is None  # our own audio echoed
    msgs = [json.loads(m) for m in call.audio(7, pcm)]
    assert [m["event"] for m in msgs] == ["mark", "media", "mark"]
    assert all(m.get("streamSid") == (sid if name == "twilio" else None) for m in msgs)
    start, end = msgs[0]["mark"]["name"], msgs[2]["mark"]["name"]
    echo = lambda name: json.dumps({"event": "mark", "mark": {"name": name}})  # noqa: E731
    assert call.receive(echo(start), now=1.5) == Played(7, "start", 1.5)
    assert call.receive(echo(end), now=1.6) == Played(7, "end", 1.6)
    assert call.receive(echo(end)) is None  # a second echo means nothing
    assert call.receive(json.dumps({"event": "dtmf", "streamSid": SID,
                                    "dtmf": {"track": "inbound_track", "digit": "5"}})) == ClientEvent("dtmf", {"digit": "5"})
    with pytest.raises(CallEnded):
        call.receive(json.dumps({"event": "stop", "streamSid": SID, "stop": {"callSid": "CA1"}}))


def _telnyx_serializer(encoding: str):
    from types import SimpleNamespace

    from pipecat.serializers.telnyx import TelnyxFrameSerializer

    params = TelnyxFrameSerializer.InputParams(sample_rate=8000, auto_hang_up=False)
    ser = TelnyxFrameSerializer(TELNYX_ID, encoding, encoding, params=params)
    asyncio.run(ser.setup(SimpleNamespace(audio_in_sample_rate=8000)))
    return ser


@pytest.mark.parametrize("encoding", ["PCMU", "PCMA"])
def test_telnyx_wire_format_matches_pipecats_telnyx_serializer(encoding):
    from pipecat.frames.frames import InterruptionFrame, OutputAudioRawFrame

    ser = _telnyx_serializer(encoding)
    call = MediaStreamCall(TELNYX)
    call.receive(telnyx_start_message().replace('"PCMU"', f'"{encoding}"'))
    payload = np.random.default_rng(1).integers(0, 256, 160, dtype=np.uint8).tobytes()
    msg = inbound_media(payload).replace('"streamSid"', '"stream_id"')
    theirs = np.frombuffer(asyncio.run(ser.deserialize(msg)).audio, dtype=np.int16)
    assert np.array_equal(np.round(call.receive(msg).pcm * 32768).astype(np.int16), theirs)
    pcm = (np.sin(np.arange(800) / 7.0) * 12000).astype(np.int16)
    theirs = json.loads(asyncio.run(ser.serialize(OutputAudioRawFrame(pcm.tobytes(), 8000, 1))))
    assert json.loads(call.audio(3, pcm)[1]) == theirs
    assert [json.loads(m) for m in call.clear()] == [json.loads(asyncio.run(ser.serialize(InterruptionFrame())))]


def test_cleared_audio_never_counts_as_played():
    call = MediaStreamCall()
    call.receive(start_message())
    names = [json.loads(m)["mark"]["name"] for cid in (1, 2) for m in call.audio(cid, np.zeros(800, np.int16))
             if json.loads(m)["event"] == "mark"]
    echo = lambda name: json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": name}})  # noqa: E731
    assert call.receive(echo(names[0])) == Played(1, "start", None)
    assert [json.loads(m) for m in call.clear()] == [{"event": "clear", "streamSid": SID}]
    # Twilio hands back the marks that were still queued; none of that audio was heard
    assert [call.receive(echo(n)) for n in names[1:]] == [None, None, None]


def test_marks_a_peer_never_echoes_stay_bounded():
    call = MediaStreamCall()
    call.receive(start_message())
    for cid in range(3 * MAX_PENDING_MARKS):
        call.audio(cid, np.zeros(8, np.int16))
    assert len(call._pending) <= MAX_PENDING_MARKS


def test_a_law_streams_decode_as_a_law():
    call = MediaStreamCall()
    call.receive(start_message(encoding="audio/x-alaw"))
    pcm = np.array([0, 5000, -5000], np.int16)
    ev = call.receive(inbound_media(alaw_encode(pcm)))
    assert np.array_equal(np.round(ev.pcm * 32768).astype(np.int16), alaw_decode(alaw_encode(pcm)))


@pytest.mark.parametrize("message, code", [
    ("{not json", "bad_json"),
    ("[1, 2]", "bad_message"),
    (json.dumps({"event": 5}), "bad_message"),
    (json.dumps({"event": "hangup"}), "unknown_event"),
    (json.dumps({"event": "media", "media": {"payload": "@@@"}}), "bad_audio"),
    (json.dumps({"event": "media", "media": "x"}), "bad_message"),
    (json.dumps({"event": "media", "media": {"payload": "A" * 20000}}), "bad_message"),
    (json.dumps({"event": "start", "start": {"streamSid": "S",
                                             "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000}}}),
     "unsupported_format"),
    (json.dumps({"event": "dtmf", "dtmf": {"digit": "55"}}), "bad_message"),
    (json.dumps({"event": "mark", "mark": {"name": 3}}), "bad_message"),
    ("x" * 70000, "frame_too_large"),
])
def test_bad_messages_say_what_is_wrong(message, code):
    with pytest.raises(ProtocolError) as e:
        parse_message(message)
    assert e.value.code == code


def test_media_before_start_is_an_error_not_a_crash():
    with pytest.raises(ProtocolError) as e:
        MediaStreamCall().receive(inbound_media(b"\x00" * 160))
    assert e.value.code == "no_start"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(event=st.sampled_from(["connected", "start", "media", "mark", "dtmf", "stop", "clear", "x"]),
       body=st.dictionaries(st.sampled_from(["start", "media", "mark", "dtmf", "stop", "streamSid", "payload"]),
                            json_values, max_size=4))
def test_fuzzed_messages_give_events_or_protocol_errors(event, body):
    call = MediaStreamCall()
    call.receive(start_message())
    try:
        call.receive(json.dumps({"event": event, **body}))
    except (ProtocolError, CallEnded):
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_fuzzed_garbage_gives_protocol_errors(message):
    try:
        MediaStreamCall().receive(message)
    except (ProtocolError, CallEnded):
        pass
