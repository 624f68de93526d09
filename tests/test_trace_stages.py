"""agent.tracing.stages.breakdown: the one per-turn stage breakdown (session records, trace report, bench)."""
import pytest
from hypothesis import assume, given, settings, strategies as st

from agent.conversation.records import TurnRecord
from agent.tracing.stages import MILESTONES, STAGE_KEYS, breakdown

# perf_counter seconds, or 0.0: not reached (TurnRecord's default)
mark = st.one_of(st.just(0.0), st.floats(1000.0, 1010.0, allow_nan=False))


def _summary_before(marks):
    """TurnRecord.summary()'s own stage code of agent/conversation/session.py at 2a1b1f3, kept as the oracle
    that breakdown() reproduces."""
    names = ["endpoint_ms", "asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms", "send_ms"]
    stages = {}
    prev = marks[0]
    for name, m in zip(names, marks[1:]):
        if not (m and prev):
            stages[name] = None
            continue
        m = max(m, prev)
        stages[name] = round((m - prev) * 1000, 1)
        prev = m
    v2v = marks[5] - marks[0] if marks[5] and marks[0] else None
    stages["voice_to_voice_ms"] = round(v2v * 1000, 1) if v2v is not None else None
    return stages


@settings(max_examples=300, deadline=None)
@given(st.floats(1000.0, 1010.0, allow_nan=False), st.lists(mark, min_size=5, max_size=5))
def test_it_is_what_turn_record_summary_computed(speech_end, later):
    """Same keys, same numbers as the session's records had, for every record that has a speech
    end and plays its first audio last, as a session does. (Audio out before another milestone
    never happens; there the oracle's voice-to-voice is unclamped and does not equal its stages' sum.)"""
    marks = [speech_end, *later]
    assume(not marks[5] or marks[5] >= max(marks))
    got = breakdown(*marks)
    assert list(got) == [*STAGE_KEYS, "voice_to_voice_ms"]
    assert got == _summary_before(marks)
    rec = TurnRecord(0, **dict(zip(MILESTONES, marks)))
    assert list(rec.summary()) == ["turn", "user", "reply", "heard", "interrupted", "speculative",
                                   *STAGE_KEYS, "voice_to_voice_ms", "mouth_to_ear_ms", "error", "tts_skipped"]
    assert {k: rec.summary()[k] for k in got} == got


@settings(max_examples=300, deadline=None)
@given(st.lists(mark, min_size=6, max_size=6))
def test_stages_are_never_negative_and_add_up_to_voice_to_voice(marks):
    b = breakdown(*marks)
    stages = [b[k] for k in STAGE_KEYS if b[k] is not None]
    assert all(v >= 0 for v in stages)
    if b["voice_to_voice_ms"] is not None:
        assert sum(stages) == pytest.approx(b["voice_to_voice_ms"], abs=0.3)  # 0.1 ms rounding


def test_a_committed_speculative_turn_has_no_negative_stage():
    # the LLM started on a partial: its first token came before the endpoint and the final
    b = breakdown(10.0, 10.30, 10.35, 10.10, 10.50, 10.52)
    assert b == {"endpoint_ms": 300.0, "asr_final_ms": 50.0, "llm_ttft_ms": 0.0,
                 "tts_first_chunk_ms": 150.0, "send_ms": 20.0, "voice_to_voice_ms": 520.0}


def test_missing_milestones_and_units():
    # a missing milestone (None or 0) leaves its stage empty; the next one covers the gap
    b = breakdown(10.0, 10.2, None, 10.5, 0, 10.65)
    assert b["asr_final_ms"] is None and b["tts_first_chunk_ms"] is None
    assert b["llm_ttft_ms"] == 300.0 and b["send_ms"] == 150.0 and b["voice_to_voice_ms"] == 650.0
    # trace ns give the same figures
    ns = [None if t is None else int(t * 1e9) for t in (10.0, 10.2, None, 10.5, None, 10.65)]
    assert breakdown(*ns, unit_ms=1e-6) == b
    # a greeting (no user speech): no voice-to-voice, the reply's own stages still measured
    g = breakdown(0, 0, 0, 20.0, 20.05, 20.051)
    assert g["voice_to_voice_ms"] is None and g["llm_ttft_ms"] is None
    assert g["tts_first_chunk_ms"] == 50.0 and g["send_ms"] == 1.0


def test_the_far_end_playout_is_one_more_stage_when_given():
    b = breakdown(10.0, 10.3, 10.35, 10.6, 10.7, 10.702, playout_start=10.76)
    assert b["client_playout_ms"] == 58.0 and b["voice_to_voice_ms"] == 702.0
    assert breakdown(10.0, 10.3, 10.35, 10.6, 10.7, 10.702, playout_start=None)["client_playout_ms"] is None
    assert "client_playout_ms" not in breakdown(10.0, 10.3, 10.35, 10.6, 10.7, 10.702)
