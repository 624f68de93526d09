"""Session state that would grow over an hours-long call is bounded."""
import numpy as np
import pytest

from agent.conversation.records import TurnLog, TurnRecord
from asr.ring import AudioRing, merged_levels
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


def test_finer_levels_end_where_the_vads_last_frame_ends():
    # the turned-away judgement's 16 ms steps and the VAD's 32 ms frame levels come from one
    # read: with half a frame pending, the steps must not run past the last scored frame
    ring = AudioRing(4096)
    x = np.concatenate([np.full(512, 0.1), np.full(512, 0.2), np.full(300, 0.9)]).astype(np.float32)
    ring.push(x)
    steps = ring.window_levels(4, 256, 512)
    assert np.allclose(steps, [0.1, 0.1, 0.2, 0.2])
    assert np.allclose(merged_levels(steps, 2), ring.window_levels(2, 512))
    assert np.allclose(merged_levels([3.0, 4.0, 4.0], 2), [4.0])  # a leading odd step is dropped


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


def test_turn_log_follows_a_reply_while_it_runs_then_keeps_its_last_row():
    from agent.conversation.records import ReplyProgress, UserTurn

    log, turn, progress = TurnLog(keep=3), UserTurn(0, speech_end=1.0, user_text="hi"), ReplyProgress()
    log.append(TurnRecord.of(turn))

    def source() -> TurnRecord:
        return TurnRecord.of(turn, progress)

    log.follow(0, source)
    progress.tokens.append("Hel")
    assert log[0].tokens == ("Hel",) and log[0].user_text == "hi", "read mid-reply: the reply as it is now"
    log.update(0, mouth_to_ear_ms=120.0)  # the page's measure, before the reply has ended
    progress.heard_text = "Hello"
    assert log[0].mouth_to_ear_ms == 120.0 and log[0].heard_text == "Hello"
    assert not log.settle(0, lambda: TurnRecord(0)), "another source does not settle it"
    assert log.settle(0, source)
    progress.heard_text = "changed later"
    assert log[0].heard_text == "Hello" and log[0].mouth_to_ear_ms == 120.0 and [r.index for r in log] == [0]
    log.update(0, mouth_to_ear_ms=90.0)
    assert log[0].mouth_to_ear_ms == 90.0 and log[0].heard_text == "Hello"
    for i in range(1, 5):
        log.append(TurnRecord(index=i))
    log.update(0, mouth_to_ear_ms=1.0)  # no longer kept: nothing
    assert not log.settle(0, source)


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
