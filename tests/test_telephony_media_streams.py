"""Twilio-style media streams (Twilio, Telnyx, Plivo, Exotel): G.711 against audioop (what
pipecat uses), the wire formats against pipecat's own serializers for all four, whole calls in
messages as each provider documents them (`media_stream_peers`), mark bookkeeping, and fuzzed
bad input."""
import asyncio
import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_stream_peers import peer

from transport.base import AudioIn, ClientEvent, Played, ProtocolError
from transport.telephony.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from transport.telephony.marks import MAX_PENDING_MARKS
from transport.telephony.media_streams import (
    DIALECTS, EXOTEL, PLIVO, TELNYX, CallEnded, MediaStreamCall, clear_message, media_message,
    parse_message)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # stdlib up to 3.12: the G.711 everyone else uses

def test_g711_is_bit_exact_with_audioop_for_every_sample_and_code():
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    assert ulaw_encode(pcm) == audioop.lin2ulaw(pcm.tobytes(), 2)
    assert alaw_encode(pcm) == audioop.lin2alaw(pcm.tobytes(), 2)
    codes = bytes(range(256))
    assert ulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert alaw_decode(codes).tobytes() == audioop.alaw2lin(codes, 2)


CALLS = [("twilio", "audio/x-mulaw", 8000), ("twilio", "audio/x-alaw", 8000), ("telnyx", "PCMU", 8000),
         ("telnyx", "PCMA", 8000), ("plivo", "audio/x-mulaw", 8000), ("plivo", "audio/x-l16", 8000),
         ("plivo", "audio/x-l16", 16000), ("exotel", "audio/x-raw", 8000), ("exotel", "audio/x-raw", 16000),
         ("exotel", "linear16", 24000)]
ENCODE = {"audio/x-mulaw": ulaw_encode, "PCMU": ulaw_encode, "audio/x-alaw": alaw_encode, "PCMA": alaw_encode}
DECODE = {"audio/x-mulaw": ulaw_decode, "PCMU": ulaw_decode, "audio/x-alaw": alaw_decode, "PCMA": alaw_decode}


def _wire(encoding: str, pcm: np.ndarray) -> bytes:
    return ENCODE[encoding](pcm) if encoding in ENCODE else pcm.astype("<i2").tobytes()


def _unwire(encoding: str, data: bytes) -> np.ndarray:
    return DECODE[encoding](data) if encoding in DECODE else np.frombuffer(data, "<i2")


@pytest.mark.parametrize("name, encoding, rate", CALLS)
def test_a_call_end_to_end_in_messages(name, encoding, rate):
    far = peer(name, encoding, rate)
    call = MediaStreamCall(DIALECTS[name])
    if far.connected():
        assert call.receive(far.connected()) is None
    assert call.audio(1, np.zeros(80, np.int16)) == [] and call.dropped_audio == 1  # no stream yet
    ev = call.receive(far.start({"caller": "+15550100"}))
    assert ev == ClientEvent("call_start", {"stream_sid": far.sid, "call_sid": far.call_id, "param_caller": "+15550100"})
    assert call.rate == rate
    pcm = (np.sin(np.arange(rate // 50) / 3.0) * 20000).astype(np.int16)  # 20 ms
    ev = call.receive(far.media(_wire(encoding, pcm)))
    assert isinstance(ev, AudioIn) and ev.sample_rate == rate
    assert np.array_equal(np.round(ev.pcm * 32768).astype(np.int16), _unwire(encoding, _wire(encoding, pcm)))
    if name != "exotel":  # (Exotel's messages name no track: it never sends our audio back)
        assert call.receive(far.media(_wire(encoding, pcm), track="outbound")) is None  # our own audio echoed
    reply = (np.cos(np.arange(rate // 10) / 5.0) * 9000).astype(np.int16)  # a 100 ms piece
    read = [far.read(m) for m in call.audio(7, reply)]  # checks the stream id, encoding and rate
    assert [kind for kind, _ in read] == ["mark", "audio", "mark"]
    assert np.array_equal(_unwire(encoding, read[1][1]), _unwire(encoding, _wire(encoding, reply)))
    start, end = read[0][1], read[2][1]
    assert call.receive(far.echo(start), now=1.5) == Played(7, "start", 1.5)
    assert call.receive(far.echo(end), now=1.6) == Played(7, "end", 1.6)
    assert call.receive(far.echo(end)) is None  # a second echo means nothing
    assert call.receive(far.dtmf("5")) == ClientEvent("dtmf", {"digit": "5"})
    read = [far.read(m) for m in call.audio(8, reply)]
    assert [far.read(m) for m in call.clear()] == [("clear", None)]
    if far.cleared():
        assert call.receive(far.cleared()) is None
    assert call.receive(far.echo(read[0][1])) is None  # cleared: never counts as played
    if far.stop():
        with pytest.raises(CallEnded):
            call.receive(far.stop())


async def _setup(ser):
    from types import SimpleNamespace

    await ser.setup(SimpleNamespace(audio_in_sample_rate=8000))  # only the rate is read
    return ser


def _pipecat_peer(name: str, far, encoding: str):
    """pipecat's own serializer for the provider, at 8 kHz, for the stream `far` describes."""
    from pipecat.serializers.exotel import ExotelFrameSerializer
    from pipecat.serializers.plivo import PlivoFrameSerializer
    from pipecat.serializers.telnyx import TelnyxFrameSerializer
    from pipecat.serializers.twilio import TwilioFrameSerializer

    if name == "twilio":
        params = TwilioFrameSerializer.InputParams(sample_rate=8000, auto_hang_up=False)
        return asyncio.run(_setup(TwilioFrameSerializer(far.sid, params=params)))
    if name == "telnyx":
        params = TelnyxFrameSerializer.InputParams(sample_rate=8000, auto_hang_up=False)
        return asyncio.run(_setup(TelnyxFrameSerializer(far.sid, encoding, encoding, params=params)))
    if name == "plivo":
        params = PlivoFrameSerializer.InputParams(sample_rate=8000, auto_hang_up=False)
        return asyncio.run(_setup(PlivoFrameSerializer(far.sid, far.call_id, params=params)))
    return asyncio.run(_setup(ExotelFrameSerializer(far.sid, far.call_id,
                                                     ExotelFrameSerializer.InputParams(sample_rate=8000))))


@pytest.mark.parametrize("name, encoding", [("twilio", "audio/x-mulaw"), ("telnyx", "PCMU"), ("telnyx", "PCMA"), ("plivo", "audio/x-mulaw"),
                                            ("exotel", "audio/x-raw")])
def test_wire_format_matches_pipecats_serializer(name, encoding):
    """Audio in decodes to pipecat's samples; our audio and clear messages equal pipecat's
    (pipecat's Plivo serializer speaks mu-law only, its Exotel one 16-bit PCM)."""
    from pipecat.frames.frames import InterruptionFrame, OutputAudioRawFrame

    far = peer(name, encoding)
    ser = _pipecat_peer(name, far, encoding)
    call = MediaStreamCall(DIALECTS[name])
    call.receive(far.start())
    for seed in range(3):
        pcm = np.random.default_rng(seed).integers(-20000, 20000, 160).astype(np.int16)
        msg = far.media(_wire(encoding, pcm))
        theirs = np.frombuffer(asyncio.run(ser.deserialize(msg)).audio, dtype=np.int16)
        assert np.array_equal(np.round(call.receive(msg).pcm * 32768).astype(np.int16), theirs)
    pcm = (np.sin(np.arange(800) / 7.0) * 12000).astype(np.int16)
    theirs = json.loads(asyncio.run(ser.serialize(OutputAudioRawFrame(pcm.tobytes(), 8000, 1))))
    assert json.loads(call.audio(3, pcm)[1]) == theirs
    assert [json.loads(m) for m in call.clear()] == [json.loads(asyncio.run(ser.serialize(InterruptionFrame())))]


def test_exotel_payloads_are_whole_320_byte_blocks():
    """Exotel plays a payload that is not a multiple of 320 bytes with a gap after it."""
    far = peer("exotel", rate=16000)
    call = MediaStreamCall(EXOTEL)
    call.receive(far.start())
    for n in (1, 159, 160, 161, 1600, 1601):
        pcm = np.full(n, 1234, np.int16)
        _, payload = far.read(call.audio(n, pcm)[1])
        assert len(payload) % 320 == 0 and len(payload) - 2 * n < 320
        assert np.array_equal(np.frombuffer(payload, "<i2")[:n], pcm) and not np.frombuffer(payload, "<i2")[n:].any()


def test_plivo_extra_headers_become_call_parameters():
    far = peer("plivo")
    ev = MediaStreamCall(PLIVO).receive(far.start({"userId": "12345", "sessionId": "abc=xyz"}))
    assert ev.data["param_userId"] == "12345" and ev.data["param_sessionId"] == "abc=xyz"


def test_cleared_audio_never_counts_as_played():
    far = peer("twilio")
    call = MediaStreamCall()
    call.receive(far.start())
    names = [json.loads(m)["mark"]["name"] for cid in (1, 2) for m in call.audio(cid, np.zeros(800, np.int16))
             if json.loads(m)["event"] == "mark"]
    assert call.receive(far.echo(names[0])) == Played(1, "start", None)
    assert [json.loads(m) for m in call.clear()] == [{"event": "clear", "streamSid": far.sid}]
    # Twilio hands back the marks that were still queued; none of that audio was heard
    assert [call.receive(far.echo(n)) for n in names[1:]] == [None, None, None]


def test_marks_a_peer_never_echoes_stay_bounded():
    call = MediaStreamCall()
    call.receive(peer("twilio").start())
    for cid in range(3 * MAX_PENDING_MARKS):
        call.audio(cid, np.zeros(8, np.int16))
    assert len(call.marks) <= MAX_PENDING_MARKS


@pytest.mark.parametrize("message, code", [
    ("{not json", "bad_json"),
    ("[1, 2]", "bad_message"),
    (json.dumps({"event": 5}), "bad_message"),
    (json.dumps({"event": "hangup"}), "unknown_event"),
    (json.dumps({"event": "media", "media": {"payload": "@@@"}}), "bad_audio"),
    (json.dumps({"event": "media", "media": "x"}), "bad_message"),
    (json.dumps({"event": "media", "media": {"payload": "A" * 70000}}), "bad_message"),
    (json.dumps({"event": "start", "start": {"streamSid": "S",
                                             "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000}}}),
     "unsupported_format"),
    (json.dumps({"event": "dtmf", "dtmf": {"digit": "55"}}), "bad_message"),
    (json.dumps({"event": "mark", "mark": {"name": 3}}), "bad_message"),
    ("x" * 90000, "frame_too_large"),
])
def test_bad_messages_say_what_is_wrong(message, code):
    with pytest.raises(ProtocolError) as e:
        parse_message(message)
    assert e.value.code == code


@pytest.mark.parametrize("name, message, code", [
    ("plivo", json.dumps({"event": "start", "start": {"streamId": "S",
                                                      "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 24000}}}),
     "unsupported_format"),
    ("plivo", json.dumps({"event": "playedStream", "name": ["s1"]}), "bad_message"),
    ("plivo", json.dumps({"event": "checkpoint", "name": "s1"}), "unknown_event"),  # ours, never theirs
    ("exotel", json.dumps({"event": "start", "start": {"stream_sid": "S",
                                                       "media_format": {"encoding": "audio/x-alaw"}}}),
     "unsupported_format"),
    ("exotel", json.dumps({"event": "start", "start": {"stream_sid": "S", "media_format": {"sample_rate": "fast"}}}),
     "unsupported_format"),
    ("exotel", json.dumps({"event": "start", "start": {"stream_sid": "S", "media_format": {"channels": "2"}}}),
     "unsupported_format"),
])
def test_bad_messages_in_other_dialects(name, message, code):
    with pytest.raises(ProtocolError) as e:
        parse_message(message, DIALECTS[name])
    assert e.value.code == code


def test_pcm_audio_of_an_odd_byte_count_is_an_error():
    far = peer("exotel")
    call = MediaStreamCall(EXOTEL)
    call.receive(far.start())
    with pytest.raises(ProtocolError) as e:
        call.receive(far.media(b"\x00" * 161))
    assert e.value.code == "bad_audio"


def test_media_before_start_is_an_error_not_a_crash():
    with pytest.raises(ProtocolError) as e:
        MediaStreamCall().receive(peer("twilio").media(b"\x00" * 160))
    assert e.value.code == "no_start"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=12)


@pytest.mark.parametrize("name", DIALECTS)
@settings(max_examples=150, deadline=None)
@given(event=st.sampled_from(["connected", "start", "media", "mark", "dtmf", "stop", "clear", "playedStream",
                              "clearedAudio", "x"]),
       body=st.dictionaries(st.sampled_from(["start", "media", "mark", "dtmf", "stop", "streamSid", "payload", "name",
                                             "extra_headers"]), json_values, max_size=4))
def test_fuzzed_messages_give_events_or_protocol_errors(name, event, body):
    call = MediaStreamCall(DIALECTS[name])
    call.receive(peer(name).start())
    try:
        call.receive(json.dumps({"event": event, **body}))
    except (ProtocolError, CallEnded):
        pass


@pytest.mark.parametrize("name", DIALECTS)
@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_fuzzed_garbage_gives_protocol_errors(name, message):
    try:
        MediaStreamCall(DIALECTS[name]).receive(message)
    except (ProtocolError, CallEnded):
        pass


@pytest.mark.parametrize("name", DIALECTS)
def test_an_integer_too_long_for_python_is_bad_json(name):
    """Found by scripts/fuzz_sockets.py: valid JSON with a number of more than 4300 digits made
    json.loads raise a plain ValueError, which ended the call (transport.wire)."""
    call = MediaStreamCall(DIALECTS[name])
    call.receive(peer(name).start())
    with pytest.raises(ProtocolError) as e:
        call.receive('{"event": "media", "media": {"payload": "", "chunk": ' + "9" * 5000 + "}}")
    assert e.value.code == "bad_json"
