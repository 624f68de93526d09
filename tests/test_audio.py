"""PCM helpers: streaming resampling keeps length and pitch."""
import numpy as np
import pytest

from transport.audio import Int16RateAdapter, StreamResampler


def test_int16_adapter_streams_to_the_output_rate():
    adapt = Int16RateAdapter(16000)
    t = np.arange(22050) / 22050
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    out = np.concatenate([adapt(tone[i:i + 2205], 22050) for i in range(0, tone.size, 2205)])
    # a streaming resampler holds a few ms back until more audio comes (LQ: ~20 ms)
    assert out.dtype == np.int16 and 16000 - 400 < out.size <= 16000
    spectrum = np.abs(np.fft.rfft(out[1000:15000].astype(np.float32)))
    peak_hz = np.argmax(spectrum) * 16000 / 14000
    assert abs(peak_hz - 440) < 5
    same = np.arange(100, dtype=np.int16)
    assert adapt(same, 16000) is same


def test_stream_resampler_rejects_bad_rates():
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)


async def test_an_input_timed_from_the_reply_starts_that_long_after_the_reply_began_playing(tmp_path):
    from transport.base import AudioIn, AudioOut
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    ask, over = np.full(8000, 0.5, np.float32), np.full(3200, 0.25, np.float32)
    t = WavConversationTransport([ScriptedTurn(ask, 16000, "ask"), ScriptedTurn(over, 16000, "over", 0.6, True)],
                                 16000, str(tmp_path / "out.wav"), realtime=False)
    frames = []  # (timeline second the frame ends, its first sample)
    while len(frames) < 150:
        ev = await t.receive()
        if isinstance(ev, AudioIn):
            frames.append((t.now(), float(ev.pcm[0])))
        if len(frames) == 25 + 40:  # the reply comes 0.8 s after the question ended, and plays at once
            await t.send_audio(AudioOut(np.full(16000, 1000, np.int16), 16000, chunk_id=1, text="a"))
    # the reply began playing at 1.30 s: the input starts 0.6 s later, not 0.6 s after the question
    assert t.input_start_times == pytest.approx([0.0, 1.9]) and t.input_end_times == pytest.approx([0.5, 2.1])
    assert all(x == 0 for _, x in frames[25:95]) and [x for _, x in frames[95:105]] == [0.25] * 10
    t.close()


async def test_wav_far_end_reports_a_piece_before_the_mic_frame_it_started_in(tmp_path):
    # the session must know a piece was played before it handles the frame that barges in over it
    from transport.base import AudioIn, AudioOut, Played
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    t = WavConversationTransport([ScriptedTurn(np.zeros(16000, np.float32), 16000, "q")], 16000,
                                 str(tmp_path / "out.wav"), realtime=False)
    first = await t.receive()
    assert isinstance(first, AudioIn)
    await t.send_audio(AudioOut(np.full(1600, 1000, np.int16), 16000, chunk_id=7, text="a"))
    events = [await t.receive() for _ in range(4)]
    kinds = [(type(e).__name__, getattr(e, "event", None)) for e in events]
    assert kinds[:2] == [("Played", "start"), ("AudioIn", None)], kinds
    assert events[0].chunk_id == 7
    t.close()
