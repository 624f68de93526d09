"""duplex trace report: per-turn table, percentiles, PNG waterfalls, stage verdicts."""
import json
import struct

import pytest
from hypothesis import given, settings, strategies as st

from agent.trace import Event, Tracer
from agent.trace_export import write_jsonl, write_perfetto
from agent.trace_report import (
    COLUMNS,
    format_table,
    main,
    percentiles,
    simulate_turns,
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
