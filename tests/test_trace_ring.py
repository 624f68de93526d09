"""Tracer core: bounded ring, spill, spans, disabled tracer, clock offset."""
import gc
import tracemalloc

import pytest

from agent.tracing.trace import STAGES, Event, NullTracer, Tracer
from agent.tracing.export import load_events

N = 1_000_000


def test_ring_bounded_over_one_million_events():
    cap = 1 << 12
    tr = Tracer("s", capacity=cap)
    instant = tr.instant
    for i in range(N):
        instant("llm", "token", 1, ts_ns=i, i=i)
    assert tr.total == N
    assert len(tr) == cap
    assert len(tr._dq) == cap and tr._dq.maxlen == cap  # storage never grows
    assert tr.dropped == N - cap
    evs = tr.events()
    assert len(evs) == cap
    # oldest first, and exactly the newest `cap` events survive
    assert [e.ts_ns for e in evs] == list(range(N - cap, N))


def test_ring_memory_flat_when_full():
    cap = 1 << 12
    tr = Tracer("s", capacity=cap)
    for i in range(2 * cap):  # fill, wrap once
        tr.instant("asr", "partial", 1, text="x")
        tr.end(tr.begin("asr", "step", 1))
    def burst(k):
        for i in range(k):
            tr.instant("asr", "partial", 1, text="x")
            tr.end(tr.begin("asr", "step", 1))
            tr.counter("rss_mb", 1.0)

    gc.freeze()  # the process's older objects (most of a full run's) stay out of the collections below
    tracemalloc.start()
    try:
        burst(cap)  # 3 events each: every slot of the ring now holds a traced event
        gc.collect()
        m1, _ = tracemalloc.get_traced_memory()
        burst(25_000)  # 75k more events: a leak of one pointer each would be 600 kB
        gc.collect()
        m2, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.unfreeze()
    assert len(tr) == cap
    # a full ring holds ~cap events whatever the count: no growth per event
    assert m1 < cap * 1024, m1
    assert m2 - m1 < 64 * 1024, m2 - m1


def test_spans_never_ended_are_bounded():
    tr = Tracer("s", capacity=64)
    for i in range(20_000):
        tr.begin("llm", "gen", i)
    assert len(tr._open) <= 4097


def test_spill_receives_overflow(tmp_path):
    p = tmp_path / "spill.jsonl"
    cap = 1000
    n = 20_003  # 40 spills of half the ring, and a part-filled ring left
    tr = Tracer("sess-1", capacity=cap, spill_path=str(p))
    for i in range(n):
        tr.instant("audio_in", "frame", i // 1000, ts_ns=i, i=i)
    tr.flush()
    assert len(tr) <= cap
    assert tr.spilled + len(tr) == n
    assert tr.dropped == 0
    assert p.stat().st_size > 0
    spilled = load_events(str(p))
    assert len(spilled) == tr.spilled
    assert all(e.session == "sess-1" for e in spilled)
    everything = tr.events(include_spilled=True)
    assert [e.ts_ns for e in everything] == list(range(n))
    assert everything[12345].args == {"i": 12345}
    assert everything[12345].turn == 12
    tr.close()


def test_instant_span_counter_fields():
    tr = Tracer("s")
    tr.instant("turn", "user_speech_end", 3, ts_ns=123, flow=7, src="file")
    sid = tr.begin("llm", "generate", 3, flow=7, model="m")
    assert sid > 0
    tr.end(sid, tokens=5)
    with tr.span("asr", "step", turn=3, audio_s=0.08) as sid2:
        assert sid2 > 0
    tr.counter("rss_mb", 12.5, ts_ns=999)
    ev = tr.events()
    assert [e.ph for e in ev] == ["i", "X", "X", "C"]
    assert ev[0] == Event("i", 123, "turn", "user_speech_end", 3, 7, {"src": "file"}, 0, 0, "s")
    assert ev[1].args == {"model": "m", "tokens": 5} and ev[1].dur_ns >= 0 and ev[1].id == sid
    assert ev[2].args == {"audio_s": 0.08}
    assert ev[3].stage == "memory" and ev[3].name == "rss_mb" and ev[3].args == {"value": 12.5}
    assert ev[3].ts_ns == 999


def test_span_records_error_and_reraises():
    tr = Tracer("s")
    with pytest.raises(ValueError):
        with tr.span("tts", "synth", 1):
            raise ValueError("boom")
    (e,) = tr.events()
    assert e.args["error"] == "ValueError"


def test_clock_is_monotonic_perf_counter():
    tr = Tracer("s")
    a = tr.now_ns()
    tr.instant("vad", "speech", 1)
    b = tr.now_ns()
    (e,) = tr.events()
    assert a <= e.ts_ns <= b


def test_disabled_tracer_records_nothing():
    tr = Tracer("s")
    tr.enabled = False
    tr.instant("vad", "speech", 1)
    assert tr.begin("llm", "x") == 0
    tr.end(0)
    with tr.span("asr", "step") as sid:
        assert sid == 0
    tr.counter("rss_mb", 1.0)
    tr.complete("tts", "synth", 0, 10)
    assert tr.events() == [] and tr.total == 0
    assert NullTracer().enabled is False


def test_clock_offset_picks_min_rtt_sample():
    tr = Tracer("s")
    assert tr.clock_offset() is None
    # true offset: server = client + 5_000_000; symmetric 2 ms path, then a skewed slow one
    off = tr.clock_offset(server_send_ns=100_000_000, client_ns=96_000_000, server_recv_ns=104_000_000)
    assert off == 6_000_000  # (100+104)/2 - 96
    off = tr.clock_offset(server_send_ns=200_000_000, client_ns=196_000_000, server_recv_ns=202_000_000)
    assert off == 5_000_000 and tr.clock_rtt_ns == 2_000_000
    off = tr.clock_offset(server_send_ns=300_000_000, client_ns=280_000_000, server_recv_ns=340_000_000)
    assert off == 5_000_000  # slow sample ignored
    assert tr.client_to_server_ns(1_000) == 5_001_000
    assert tr.clock_offset(offset_ns=42) == 42
    with pytest.raises(ValueError):
        tr.clock_offset(server_send_ns=10, client_ns=0, server_recv_ns=5)


def test_stage_names_documented():
    import agent.tracing.trace as mod

    for s in STAGES:
        assert f"``{s}``" in mod.__doc__
    assert len(set(STAGES)) == 11


def test_concurrent_writers_lose_nothing(tmp_path):
    import threading

    tr = Tracer("s", capacity=1 << 10, spill_path=str(tmp_path / "sp.jsonl"))
    per = 20_000

    def work(k):
        for i in range(per):
            tr.instant("asr", "partial", k, ts_ns=k * per + i)

    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    got = sorted(e.ts_ns for e in tr.events(include_spilled=True))
    assert got == list(range(4 * per))
    tr.close()
