"""`duplex bench pipecat`'s machinery, fast: the client's wire clock on pipecat's own protobuf
serializer, the questions' end of speech, the summary. (The benchmark itself is a command:
`duplex bench pipecat`; a run takes minutes and its figures are not asserted anywhere.)"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import flite_available

from agent.bench.pipecat_peer import (
    LEAD_S,
    RATE,
    Result,
    Turn,
    _wire_serializer,
    make_questions,
)


async def test_wire_clock_marks_the_frame_with_the_last_speech_sample_and_reads_the_reply():
    from pipecat.frames.frames import (
        OutputAudioRawFrame,
        OutputTransportMessageUrgentFrame,
    )
    from pipecat.serializers.protobuf import ProtobufFrameSerializer

    wire = _wire_serializer()
    wire.mark = 1000  # the question's last speech sample
    for n in range(3):  # 960 samples: not yet
        assert await wire.serialize(OutputAudioRawFrame(bytes(640), RATE, 1))
        assert wire.mark_t is None, n
    await wire.serialize(OutputAudioRawFrame(bytes(640), RATE, 1))  # samples 960..1279
    assert wire.mark_t is not None and wire.samples_sent == 1280

    bot = ProtobufFrameSerializer()  # what the bot's server transport sends
    reply = await bot.serialize(OutputTransportMessageUrgentFrame(message={"type": "bot-reply", "text": "Paris."}))
    audio = await bot.serialize(OutputAudioRawFrame(np.arange(480, dtype=np.int16).tobytes(), 24000, 1))
    await wire.deserialize(audio)
    await wire.deserialize(reply)
    assert [text for _, text in wire.replies] == ["Paris."]
    assert len(wire.audio_in) == 1 and wire.out_rate == 24000
    assert np.array_equal(np.frombuffer(wire.audio_in[0][1], np.int16), np.arange(480))
    assert wire.audio_in[0][0] >= wire.mark_t


@pytest.mark.skipif(not flite_available(), reason="flite is missing")
def test_questions_end_of_speech_is_inside_the_spoken_clip(tmp_path):
    questions = make_questions(["What is the capital of France?", "Why is the sky blue?"], tmp_path)
    for text, pcm, end in questions:
        assert LEAD_S + 0.5 < end <= pcm.size / RATE, text  # after the lead-in, within the clip
        assert np.abs(pcm[int(end * RATE):]).max(initial=0) < 0.05  # nothing loud after it


def test_summary_leaves_out_warm_ups_and_missing_replies():
    r = Result([Turn("duplex", "w", 5000.0, warmup=True), Turn("pipecat", "w", 9000.0, warmup=True)]
               + [Turn("duplex", "q", v) for v in (600.0, 800.0, None)]
               + [Turn("pipecat", "q", v) for v in (1800.0, 2200.0, 2000.0)])
    s = r.summary()
    assert s["duplex"] == {"answered": 2, "asked": 3, "p50_ms": 700.0, "p90_ms": 780.0}
    assert s["pipecat"]["p50_ms"] == 2000.0 and s["pipecat"]["answered"] == 3
    assert s["ratio_p50"] == round(2000.0 / 700.0, 2)
    assert Result([Turn("duplex", "q", None)]).summary()["ratio_p50"] is None
