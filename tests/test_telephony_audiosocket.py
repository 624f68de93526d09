"""Asterisk AudioSocket: framing under any split, call events, bad frames, and paced playback."""
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.base import AudioIn, ClientEvent, Played, ProtocolError
from transport.telephony.audiosocket import (
    DTMF, ERROR, HANGUP, UUID, AudioSocketCall, CallEnded, Frame, FrameParser, encode_audio,
    encode_frame)
from transport.playback import Playback

frames = st.lists(st.builds(Frame, st.sampled_from([0x00, 0x01, 0x03, 0x10, 0x12, 0xFF, 0x42]),
                            st.binary(max_size=700)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(frames=frames, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_frames_come_out_whole_however_the_bytes_are_split(frames, cuts):
    wire = b"".join(encode_frame(f.kind, f.payload) for f in frames)
    parser, out, at = FrameParser(), [], 0
    for cut in sorted(c % (len(wire) + 1) for c in cuts) + [len(wire)]:
        out += parser.feed(wire[at:cut])
        at = cut
    assert out == frames
    assert len(parser._buf) == 0


def test_an_unfinished_frame_waits_and_nothing_else_is_kept():
    parser = FrameParser()
    assert parser.feed(b"\x10\x01") == []
    assert parser.feed(b"\x40" + b"\x00" * 100) == []
    assert len(parser._buf) == 103
    assert parser.feed(b"\x00" * 220) == [Frame(0x10, b"\x00" * 320)]
    assert len(parser._buf) == 0


def test_a_call_in_frames():
    call = AudioSocketCall()
    cid = uuid.UUID("40325ec2-5efd-4bd3-805f-53576e581d13")
    assert call.receive(Frame(UUID, cid.bytes)) == ClientEvent("call_start", {"call_id": str(cid)})
    pcm = np.array([0, 1000, -1000, 32767, -32768], np.int16)
    ev = call.receive(Frame(0x10, pcm.astype("<i2").tobytes()))
    assert isinstance(ev, AudioIn) and ev.sample_rate == 8000
    assert np.array_equal(np.round(ev.pcm * 32768).astype(np.int16), pcm)
    assert call.receive(Frame(0x12, pcm.tobytes())).sample_rate == 16000 and call.rate == 16000
    assert call.receive(Frame(DTMF, b"#")) == ClientEvent("dtmf", {"digit": "#"})
    assert call.receive(Frame(ERROR, b"\x02")) == ClientEvent("far_end_error", {"code": 2})
    with pytest.raises(CallEnded):
        call.receive(Frame(ERROR, b"\x01"))  # Asterisk's "the caller hung up"
    with pytest.raises(CallEnded):
        call.receive(Frame(HANGUP))


@pytest.mark.parametrize("frame, code", [
    (Frame(0x10, b"\x00\x00\x00"), "bad_audio"),
    (Frame(UUID, b"\x00" * 15), "bad_message"),
    (Frame(DTMF, b"55"), "bad_message"),
    (Frame(DTMF, b"x"), "bad_message"),
    (Frame(0x42, b""), "unknown_kind"),
])
def test_bad_frames_say_what_is_wrong(frame, code):
    with pytest.raises(ProtocolError) as e:
        AudioSocketCall().receive(frame)
    assert e.value.code == code


@settings(max_examples=200, deadline=None)
@given(frames)
def test_fuzzed_frames_give_events_or_protocol_errors(frames):
    call = AudioSocketCall()
    for f in frames:
        try:
            call.receive(f)
        except (ProtocolError, CallEnded):
            pass


def test_playback_goes_out_20_ms_a_tick_and_says_what_started_and_ended():
    pb = Playback(8000)
    assert pb.tick(0.0) == (None, [])
    pb.push(1, np.ones(250, np.int16))  # 31.25 ms
    pb.push(2, np.full(100, 2, np.int16))
    frame, events = pb.tick(0.0)
    assert frame.size == 160 and (frame == 1).all() and events == [Played(1, "start", 0.0)]
    frame, events = pb.tick(0.02)
    assert list(frame[:90]) == [1] * 90 and list(frame[90:160]) == [2] * 70
    assert events == [Played(1, "end", 0.02), Played(2, "start", 0.02)]
    frame, events = pb.tick(0.04)
    assert list(frame[:30]) == [2] * 30 and not frame[30:].any() and events == [Played(2, "end", 0.04)]
    assert pb.tick(0.06) == (None, []) and pb.queued == 0
    pb.push(3, np.zeros(0, np.int16))  # a piece the resampler held back entirely still plays
    assert pb.tick(0.08) == (None, [Played(3, "start", 0.08), Played(3, "end", 0.08)])


def test_clear_drops_what_was_not_sent_and_playback_is_bounded():
    pb = Playback(8000, max_s=1.0)
    pb.push(1, np.ones(800, np.int16))
    pb.tick()
    pb.clear()
    assert pb.tick() == (None, []) and pb.queued == 0
    pb.push(2, np.ones(8000, np.int16))
    with pytest.raises(OverflowError):
        pb.push(3, np.ones(1, np.int16))
    assert pb.queued == 8000


def test_audio_frames_encode_at_the_callers_rate():
    pcm = np.arange(160, dtype=np.int16)
    assert encode_audio(pcm) == b"\x10\x01\x40" + pcm.astype("<i2").tobytes()
    assert encode_audio(pcm, 16000)[0] == 0x12
