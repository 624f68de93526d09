"""moshi-server ASR wire format: pure decode/encode (fuzzed) and the server's answers to bad input."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st

from asr.moshi_protocol import (
    MAX_PCM_SAMPLES,
    Audio,
    BadMessage,
    EndWord,
    Error,
    Flush,
    Init,
    Marker,
    MarkerReply,
    Ready,
    Step,
    Word,
    decode_client,
    decode_server,
    encode_client,
    encode_server,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


KEY = {"kyutai-api-key": "public_token"}


# ---- pure functions ------------------------------------------------------------------------
def test_kyutai_client_audio_decodes():
    raw = msgpack.packb({"type": "Audio", "pcm": [0.0, 0.5, -0.25]}, use_single_float=True)
    msg = decode_client(raw)
    assert isinstance(msg, Audio) and msg.pcm.dtype == np.float32
    np.testing.assert_array_equal(msg.pcm, [0.0, 0.5, -0.25])
    assert decode_client(msgpack.packb({"type": "Marker", "id": 7})) == Marker(7)
    assert decode_client(msgpack.packb({"type": "Init"})) == Init()
    assert decode_client(msgpack.packb({"type": "Flush"})) == Flush()


@pytest.mark.parametrize("raw, reason", [
    (b"\xc1", "malformed msgpack"),
    (b"\x92\x01", "malformed msgpack"),  # truncated array
    (msgpack.packb([1, 2]), "map"),
    (msgpack.packb({"pcm": [0.1]}), "type"),
    (msgpack.packb({"type": 3}), "type"),
    (msgpack.packb({"type": "Bogus"}), "unknown"),
    (msgpack.packb({"type": "Audio"}), "array"),
    (msgpack.packb({"type": "Audio", "pcm": "abc"}), "array"),
    (msgpack.packb({"type": "Audio", "pcm": []}), "empty"),
    (msgpack.packb({"type": "Audio", "pcm": ["x", 1.0]}), "numbers"),
    (msgpack.packb({"type": "Audio", "pcm": [[0.1], [0.2]]}), "numbers"),
    (msgpack.packb({"type": "Audio", "pcm": [0.1, None]}), "numbers"),
    (msgpack.packb({"type": "Audio", "pcm": [0.1, float("nan")]}), "NaN"),
    (msgpack.packb({"type": "Audio", "pcm": [float("inf")]}), "NaN"),
    (msgpack.packb({"type": "Audio", "pcm": [1e300]}), "NaN"),
    (msgpack.packb({"type": "Audio", "pcm": [0.0] * (MAX_PCM_SAMPLES + 1)}), "samples"),
    (msgpack.packb({"type": "Marker", "id": "1"}), "id"),
    (msgpack.packb({"type": "Marker", "id": True}), "id"),
    (msgpack.packb({"type": "Marker"}), "id"),
    (msgpack.packb({"type": "OggOpus", "data": b"x"}), "OggOpus"),
    ("text frame", "text"),
])
def test_bad_client_messages_give_clear_errors(raw, reason):
    with pytest.raises(BadMessage, match=reason):
        decode_client(raw)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_decode_random_bytes_never_crashes(data):
    try:
        decode_client(data)
    except BadMessage:
        pass


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["type", "pcm", "id", "data", "x"]),
                       json_like | st.sampled_from(["Audio", "Marker", "Init", "Flush", "OggOpus"]), max_size=4))
def test_decode_random_maps_accepts_only_valid_messages(d):
    try:
        msg = decode_client(msgpack.packb(d))
    except BadMessage:
        return
    if isinstance(msg, Audio):
        assert d["type"] == "Audio" and 0 < msg.pcm.size <= MAX_PCM_SAMPLES
        assert msg.pcm.dtype == np.float32 and np.isfinite(msg.pcm).all()
    elif isinstance(msg, Marker):
        assert d["type"] == "Marker" and isinstance(d["id"], int) and not isinstance(d["id"], bool)
    else:
        assert d["type"] in ("Init", "Flush")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=300))
def test_audio_roundtrip(samples):
    pcm = np.asarray(samples, np.float32)
    msg = decode_client(encode_client(Audio(pcm)))
    np.testing.assert_array_equal(msg.pcm, pcm)


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.builds(Word, st.text(max_size=20), st.floats(0, 1e6)),
    st.builds(EndWord, st.floats(0, 1e6)),
    st.builds(Step, st.integers(0, 2**40)),
    st.builds(MarkerReply, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Error, st.text(max_size=40)),
    st.just(Ready()),
), st.integers(0, 10**7))
def test_server_messages_have_moshi_shape(msg, buffered):
    d = decode_server(encode_server(msg, buffered))
    assert d["buffered_pcm"] == buffered
    expected = {Word: {"text", "start_time"}, EndWord: {"stop_time"}, Step: {"step_idx", "prs"},
                MarkerReply: {"id"}, Error: {"message"}, Ready: set()}[type(msg)]
    assert set(d) == expected | {"type", "buffered_pcm"}
    assert d["type"] == {MarkerReply: "Marker"}.get(type(msg), type(msg).__name__)
    if isinstance(msg, Word):
        assert d["text"] == msg.text and math.isclose(d["start_time"], msg.start_time)


# ---- over the wire -------------------------------------------------------------------------


async def test_server_answers_bad_input_with_error_and_keeps_serving():
    import sys, os
    sys.path.insert(0, os.path.dirname(__file__))
    from test_engine_server import audio_msg, recv, recv_until, running_server

    bad = [
        b"\xc1\xc1",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"type": "Audio", "pcm": "zzz"}),
        msgpack.packb({"type": "Audio", "pcm": []}),
        msgpack.packb({"type": "Audio", "pcm": [0.0] * (MAX_PCM_SAMPLES + 1)}, use_single_float=True),
        msgpack.packb({"type": "Audio", "pcm": [0.1, float("nan")]}),
        msgpack.packb({"type": "Marker", "id": "x"}),
        "a text frame",
    ]
    async with running_server(slots=2) as (sched, server, url):
        async with websockets.connect(url, additional_headers=KEY) as other, \
                websockets.connect(url, additional_headers=KEY) as ws:
            assert (await recv(other))["type"] == "Ready" and (await recv(ws))["type"] == "Ready"
            for raw in bad:
                await ws.send(raw)
                err, _ = await recv_until(ws, "Error")
                assert err["message"]
            assert server.protocol_errors == len(bad)
            # the same connection and the other one still work
            for conn in (ws, other):
                await conn.send(audio_msg(np.zeros(1920 * 2)))
                step, _ = await recv_until(conn, "Step")
                assert step["step_idx"] == 1
