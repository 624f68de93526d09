"""duplex trace report: per-turn table, percentiles, PNG waterfalls, stage verdicts."""
import json
import struct

import pytest
from hypothesis import given, settings, strategies as st

from agent.tracing.trace import Ev, Event, Stage, Tracer
from agent.tracing.export import write_jsonl, write_perfetto
from agent.bench.simulated_turns import simulate_turns
from agent.tracing.report import (
    COLUMNS,
    format_stages,
    format_table,
    main,
    memory_trend,
    percentiles,
    stage_stats,
    turn_table,
)

MS = 1_000_000
KEYS = [k for k, _ in COLUMNS]


def _tracer(n=6, **kw):
    tr = Tracer("s1")
    simulate_turns(tr, n, speculative_turns=(2,), barge_in_turns=(3,), explicit_flow_turns=(4,), **kw)
    return tr


def _sum(row):
    return sum(row[k] for k in KEYS if row[k] is not None)


def test_stage_times_sum_to_total():
    rows = turn_table(_tracer().events())
    assert len(rows) == 6
    for r in rows:
        assert all(r[k] is not None and r[k] >= 0 for k in KEYS), r
        assert abs(_sum(r) - r["total_ms"]) <= 5.0
        assert r["total_ms"] > 0
        assert r["mouth_to_ear_ms"] >= r["server_ms"]  # playout comes after the first send
    assert rows[1]["speculative"] and rows[2]["barge_in"]


def test_columns_are_milestone_differences():
    tr = Tracer("x")
    t = 10_000 * MS
    for name, stage, dt in [("user_speech_end", "turn", 0), ("endpoint", "turn", 300),
                            ("final", "asr", 350), ("first_token", "llm", 600),
                            ("first_chunk", "tts", 700), ("send_audio", "transport", 702),
                            ("playout_start", "client", 760)]:
        tr.instant(stage, name, 1, ts_ns=t + dt * MS)
    (r,) = turn_table(tr.events())
    assert [r[k] for k in KEYS] == [300, 50, 250, 100, 2, 58]
    assert r["total_ms"] == 760 and r["server_ms"] == 702 and r["mouth_to_ear_ms"] == 760
    assert r["missing"] == []


def test_speculation_clamps_llm_before_endpoint_and_skips_cancelled_branch():
    tr = Tracer("x")
    t = 10_000 * MS
    ev = [("turn", "user_speech_end", 0), ("llm", "first_token", -100),  # cancelled branch
          ("llm", "first_token", 100),  # committed branch, before the endpoint
          ("turn", "endpoint", 250), ("asr", "final", 270), ("tts", "first_chunk", 400),
          ("transport", "send_audio", 405), ("llm", "first_token", 500)]  # later, unrelated
    for stage, name, dt in ev:
        tr.instant(stage, name, 7, ts_ns=t + dt * MS)
    (r,) = turn_table(tr.events())
    assert r["llm_ttft_ms"] == 0  # clamped: the LLM was already going
    assert r["endpoint_wait_ms"] == 250 and r["asr_final_lag_ms"] == 20
    assert r["tts_first_chunk_ms"] == 130 and r["transport_ms"] == 5
    assert r["client_playout_ms"] is None and r["mouth_to_ear_ms"] is None
    assert r["total_ms"] == 405 and _sum(r) == 405
    assert r["missing"] == ["client.playout_start"]


def test_missing_middle_milestone_keeps_sum():
    tr = Tracer("x")
    for stage, name, dt in [("turn", "user_speech_end", 0), ("turn", "endpoint", 200),
                            ("llm", "first_token", 500), ("transport", "send_audio", 650)]:
        tr.instant(stage, name, 1, ts_ns=dt * MS)
    (r,) = turn_table(tr.events())
    assert r["asr_final_lag_ms"] is None and r["tts_first_chunk_ms"] is None
    assert r["llm_ttft_ms"] == 300 and r["transport_ms"] == 150
    assert _sum(r) == r["total_ms"] == 650


MILESTONE_EVS = [("turn", "user_speech_end"), ("turn", "endpoint"), ("asr", "final"),
                 ("llm", "first_token"), ("tts", "first_chunk"), ("transport", "send_audio"),
                 ("client", "playout_start")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(MILESTONE_EVS), st.integers(0, 5_000_000_000)),
                min_size=2, max_size=30))
def test_sum_equals_total_for_any_event_order(evs):
    tr = Tracer("h")
    for (stage, name), ts in evs:
        tr.instant(stage, name, 1, ts_ns=ts)
    for r in turn_table(tr.events()):
        assert all(r[k] is None or r[k] >= 0 for k in KEYS)
        assert abs(_sum(r) - r["total_ms"]) <= 5.0
        assert r["total_ms"] >= 0


def test_percentiles():
    rows = [{k: None for k in KEYS} | {"total_ms": float(v), "server_ms": None,
             "mouth_to_ear_ms": None} for v in range(1, 101)]
    pc = percentiles(rows)
    assert pc["total_ms"]["p50"] == pytest.approx(50.5)
    assert pc["total_ms"]["p90"] == pytest.approx(90.1)
    assert pc["total_ms"]["p99"] == pytest.approx(99.01)
    assert pc["llm_ttft_ms"]["p50"] is None and pc["total_ms"]["n"] == 100


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_report_prints_table_and_writes_png(tmp_path, capsys, fmt):
    tr = _tracer()
    p = str(tmp_path / f"trace.{fmt}")
    (write_jsonl if fmt == "jsonl" else write_perfetto)(tr, p)
    png_dir = tmp_path / "png"
    assert main([p, "--png-dir", str(png_dir)]) == 0
    out = capsys.readouterr().out
    for head in ["endpoint wait", "ASR final lag", "LLM TTFT", "TTS first chunk", "transport",
                 "client playout", "total", "p50", "p90", "p99"]:
        assert head in out
    # the printed rows also sum to the printed total (rounded to 0.1 ms per cell)
    rows = [l.split() for l in out.splitlines() if l.strip()[:1].isdigit()]
    assert len(rows) == 6
    for cells in rows:
        nums = [float(c) for c in cells[1:8]]
        assert abs(sum(nums[:6]) - nums[6]) <= 5.0
    assert "verdict" in out and "llm" in out
    pngs = sorted(png_dir.glob("*.png"))
    assert len(pngs) == 6
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 5000
        w, h = struct.unpack(">II", data[16:24])  # IHDR
        assert w >= 400 and h >= 300


def test_report_json_and_errors(tmp_path, capsys):
    p = str(tmp_path / "t.jsonl")
    write_jsonl(_tracer(3), p)
    assert main([p, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["turns"]) == 3 and {s["stage"] for s in doc["stages"]} == {"asr", "llm", "tts"}
    assert main([str(tmp_path / "nope.jsonl")]) == 2
    empty = str(tmp_path / "e.jsonl")
    write_jsonl([], empty)
    assert main([empty]) == 1


def test_format_table_has_one_line_per_turn():
    rows = turn_table(_tracer(4).events())
    text = format_table(rows)
    assert len([l for l in text.splitlines() if l.strip()[:1].isdigit()]) == 4


def _span(stage, t0, dur, **a):
    return Event("X", t0, stage, "step", 1, None, a, dur, 1, "s")


def test_stage_verdict_rules():
    base = [Event("i", 0, s, "request", 1, None, {}, 0, 0, "s") for s in ("asr", "llm", "tts")]
    ends = [Event("i", 1000 * MS, s, "done", 1, None, {}, 0, 0, "s") for s in ("asr", "llm", "tts")]
    # GPU stage, back-to-back steps → GPU-bound; sparse steps → starved (waiting)
    dense = [_span("asr", i * 10 * MS, 9 * MS, device="cuda:0", audio_s=0.08) for i in range(100)]
    sparse = [_span("asr", i * 100 * MS, 5 * MS, device="cuda:0") for i in range(10)]
    v = {s["stage"]: s for s in stage_stats(base + ends + dense)}
    assert v["asr"]["verdict"] == "GPU-bound" and v["asr"]["rtf_basis"] == "audio"
    assert v["asr"]["rtf"] == pytest.approx(0.9 / 8.0, rel=1e-6)
    assert {s["stage"]: s for s in stage_stats(base + ends + sparse)}["asr"]["verdict"] == "waiting"
    # CPU stage: busy with CPU time → CPU-bound; busy but little CPU → I/O-bound
    cpu = [_span("llm", 0, 900 * MS, cpu_ns=850 * MS)]
    io = [_span("llm", 0, 900 * MS, cpu_ns=50 * MS)]
    flagged = [_span("llm", 0, 900 * MS, io=True)]
    idle = [_span("llm", 0, 50 * MS)]
    verdict = lambda evs: {s["stage"]: s for s in stage_stats(base + ends + evs)}["llm"]["verdict"]  # noqa: E731
    assert verdict(cpu) == "CPU-bound"
    assert verdict(io) == "I/O-bound"
    assert verdict(flagged) == "I/O-bound"
    assert verdict(idle) == "waiting"
    # no spans: llm busy time from request → done
    s = {x["stage"]: x for x in stage_stats(base + ends)}["llm"]
    assert s["busy_basis"] == "request→done" and s["busy_frac"] == pytest.approx(1.0)


def test_a_greeting_turn_stays_out_of_the_voice_to_voice_percentiles():
    tr = _tracer(n=2)
    t = max(e.ts_ns for e in tr.events()) + 1000 * MS
    for name, dt in (("request", 0), ("first_token", 1)):  # the bot speaks first: no user speech
        tr.instant("llm", name, 9, ts_ns=t + dt * MS)
    tr.instant("tts", "first_chunk", 9, ts_ns=t + 50 * MS)
    tr.instant("transport", "send_audio", 9, ts_ns=t + 51 * MS)
    rows = turn_table(tr.events())
    greeting = [r for r in rows if r["turn"] == 9][0]
    assert not greeting["from_user_speech"] and greeting["total_ms"] == pytest.approx(50.0)  # first token -> send
    users = [r["total_ms"] for r in rows if r["turn"] != 9]
    assert percentiles(rows)["total_ms"]["n"] == len(users) == 2
    assert percentiles(rows)["total_ms"]["p50"] == pytest.approx(sorted(users)[0] + (sorted(users)[1] - sorted(users)[0]) / 2)
    assert "9~" in format_table(rows)


# ---- true verdicts: the voice's busy time, memory after warm-up -------------------------------
VOICE_RATE = 22050


def _voice_turn(tr, turn, t, gaps_ms, synth_ms=80, chunk_s=1.0):
    """A turn of the voice as the session traces it (no spans): each piece of LLM text is a
    tts request, its audio a chunk `synth_ms` later; then the voice waits `gaps_ms[i]` for the
    LLM's next words. Returns the time of the last event."""
    tr.instant(Stage.TTS, Ev.REQUEST, turn, ts_ns=t, text="w0")
    for i in range(len(gaps_ms) + 1):
        if i:
            t += gaps_ms[i - 1] * MS
            tr.instant(Stage.TTS, Ev.REQUEST, turn, ts_ns=t, text=f"w{i}")
        t += synth_ms * MS
        if i == 0:
            tr.instant(Stage.TTS, Ev.FIRST_CHUNK, turn, ts_ns=t)
        tr.instant(Stage.TTS, Ev.CHUNK, turn, ts_ns=t, samples=int(chunk_s * VOICE_RATE),
                   sample_rate=VOICE_RATE, text=f"w{i}")
    tr.instant(Stage.TTS, Ev.DONE, turn, ts_ns=t)
    return t


def _tts(tr):
    return {s["stage"]: s for s in stage_stats(tr.events())}[Stage.TTS]


def test_tts_rtf_counts_synthesis_not_the_wait_for_llm_text():
    """The issue's two-turn run: Piper synthesizes 1 s of audio in 80 ms (RTF 0.08) and waits
    1.12 s for the LLM between pieces. request → done would read RTF 0.92, busy 100%, CPU-bound."""
    tr = Tracer("run")
    end = _voice_turn(tr, 0, 10_000 * MS, gaps_ms=[1120] * 3)
    _voice_turn(tr, 1, end + 5000 * MS, gaps_ms=[1120] * 3)
    s = _tts(tr)
    assert s["window_s"] / s["audio_s"] == pytest.approx(0.92)  # request → done over the audio: not the RTF
    assert s["busy_basis"] == "request→chunk" and s["rtf_basis"] == "audio"
    assert s["busy_s"] == pytest.approx(8 * 0.080)
    assert s["rtf"] == pytest.approx(0.08)
    assert s["busy_frac"] == pytest.approx(0.32 / 3.68)
    assert s["verdict"] == "waiting" and s["why"] == "busy 9% of window"


def test_tts_busy_back_to_back_is_cpu_bound_and_a_skipped_piece_is_not_busy():
    # the voice never waits (e.g. waterfall: the whole answer is there): CPU-bound, truly
    tr = Tracer("w")
    _voice_turn(tr, 0, 10_000 * MS, gaps_ms=[0, 0, 0])
    s = _tts(tr)
    assert s["verdict"] == "CPU-bound" and s["busy_frac"] == pytest.approx(1.0)
    assert s["rtf"] == pytest.approx(0.08)
    # a piece with no words (the voice skips it: no chunk) does not stretch into the wait for
    # the next piece
    tr = Tracer("skip")
    t = 10_000 * MS
    tr.instant(Stage.TTS, Ev.REQUEST, 0, ts_ns=t, text="...")
    _voice_turn(tr, 0, t + 2000 * MS, gaps_ms=[])
    assert _tts(tr)["busy_s"] == pytest.approx(0.080)


def _rss(tr, t0, seconds, value, every_s=0.5):
    for k in range(int(seconds / every_s) + 1):
        t = k * every_s
        tr.counter(Ev.RSS_MB, value(t) + ((k % 3) - 1) * 0.2, ts_ns=t0 + int(t * 1e9))


def _loading(t):
    """Model pages faulted in and buffers allocated on first use: +930 MB over the first 4 s."""
    return 300.0 + 930.0 * min(t / 4.0, 1.0)


def test_memory_trend_leaves_out_the_warm_up():
    t0 = 10_000 * MS
    tr = Tracer("run")
    tr.instant(Stage.TURN, Ev.TURN_END, 0, ts_ns=t0 + 1000 * MS)  # a greeting: no ASR yet
    tr.instant(Stage.ASR, Ev.FINAL, 1, ts_ns=t0 + 2000 * MS, text="hi")
    tr.instant(Stage.TURN, Ev.TURN_END, 1, ts_ns=t0 + 5000 * MS)  # first reply to the user: warm
    _rss(tr, t0, 60, _loading)
    m = memory_trend(tr.events())[Ev.RSS_MB]
    assert (m["last"] - m["first"]) == pytest.approx(930, abs=1)  # a trend with the warm-up in it: +930 MB/min
    assert m["slope_mb_per_min"] == pytest.approx(0.0, abs=0.5)
    assert m["warmup_n"] == 10 and m["n"] == 121  # samples before 5 s
    assert "MB/min over 55.0 s after warm-up (121 samples, 10 of them warm-up)" in format_stages(
        [], {Ev.RSS_MB: m})


def test_memory_growth_after_warm_up_is_still_reported():
    t0 = 10_000 * MS
    tr = Tracer("leak")
    tr.instant(Stage.ASR, Ev.FINAL, 0, ts_ns=t0 + 2000 * MS, text="hi")
    tr.instant(Stage.TURN, Ev.TURN_END, 0, ts_ns=t0 + 5000 * MS)
    _rss(tr, t0, 65, lambda t: _loading(t) + 10.0 * max(0.0, t - 5.0) / 60.0)  # +10 MB/min
    assert memory_trend(tr.events())[Ev.RSS_MB]["slope_mb_per_min"] == pytest.approx(10.0, abs=0.5)


def test_memory_trend_without_a_reply_skips_the_first_seconds():
    t0 = 10_000 * MS
    tr = Tracer("idle")
    _rss(tr, t0, 60, _loading)  # no turn at all: warm-up is the first WARMUP_FALLBACK_S
    assert memory_trend(tr.events())[Ev.RSS_MB]["slope_mb_per_min"] == pytest.approx(0.0, abs=0.5)
    tr = Tracer("short")
    _rss(tr, t0, 8, _loading)  # nothing after warm-up: no trend rather than a made-up one
    m = memory_trend(tr.events())[Ev.RSS_MB]
    assert m["slope_mb_per_min"] is None and m["warmup_n"] == m["n"]
    assert "trend n/a after warm-up" in format_stages([], {Ev.RSS_MB: m})
