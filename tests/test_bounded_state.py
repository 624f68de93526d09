"""Session state that would grow over an hours-long call is bounded."""
import numpy as np
import pytest

from agent.conversation.records import TurnLog, TurnRecord
from asr.ring import AudioRing
from agent.conversation.turns import TurnMachine


def test_audio_ring_keeps_only_the_last_samples():
    ring = AudioRing(10)
    for i in range(0, 25, 3):
        ring.push(np.arange(i, min(i + 3, 25), dtype=np.float32))
    assert ring.last(10).tolist() == list(range(15, 25))
    assert ring.last(4).tolist() == [21, 22, 23, 24]
    ring.push(np.arange(100, 130, dtype=np.float32))  # longer than the ring
    assert ring.last(100).tolist() == list(range(120, 130))


def test_audio_ring_windows_stay_aligned_with_the_stream_start():
    # the VAD scores 512-sample windows from the stream's first sample; the ring's levels and
    # "audio up to the last scored window" must use the same boundaries, even after a wrap
    # and a chunk longer than the ring
    ring, stream = AudioRing(1500), []
    rng = np.random.default_rng(0)
    for n in (300, 700, 1, 2600, 512, 90, 1023):
        x = rng.standard_normal(n).astype(np.float32)
        ring.push(x)
        stream.append(x)
        s = np.concatenate(stream)
        whole = s.size - s.size % 512
        assert np.array_equal(ring.last_whole(900, 512), s[:whole][-900:])
        want = [float(np.sqrt(np.mean(s[i:i + 512].astype(np.float64) ** 2))) for i in range(0, whole, 512)]
        got = ring.window_levels(2, 512)
        assert len(got) == min(2, len(want), (1500 - s.size % 512) // 512)
        assert np.allclose(got, want[len(want) - len(got):])


def test_turn_log_keeps_recent_turns_by_absolute_index():
    log = TurnLog(keep=3)
    for i in range(10):
        log.append(TurnRecord(index=i))
    assert len(log) == 10 and [r.index for r in log] == [7, 8, 9]
    assert log[9].index == 9 and 8 in log and 6 not in log
    log[8] = TurnRecord(index=8, user_text="replaced")
    assert log[8].user_text == "replaced"
    with pytest.raises(IndexError):
        log[2]


def test_turn_machine_transitions_are_bounded():
    m = TurnMachine()
    t = 0.0
    for _ in range(2000):  # 2000 short turns
        for p in [0.9] * 5 + [0.05] * 8:
            t += 0.032
            m.on_vad(t, p, 0.032)
        m.on_eou(t, 0.9)
        m.on_reply_finished(t)
    assert len(m.transitions) == 1024
