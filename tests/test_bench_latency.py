"""`duplex bench latency`: exact end of speech, turn matching, and a smoke run with real models."""
import json

import numpy as np
import pytest

from agent.bench.latency import ScriptLine, main, match_turns, speech_end_offset
from agent.conversation.records import TurnRecord
from agent.tracing.stages import STAGE_KEYS
from helpers import DEV, flite_available


def test_speech_end_is_the_last_loud_sample():
    rate = 16000
    t = np.arange(int(0.8 * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t).astype(np.float32)
    noise = np.random.default_rng(0).normal(0, 0.001, int(0.6 * rate)).astype(np.float32)  # well under 1%
    x = np.concatenate([np.zeros(rate // 2, np.float32), tone, noise])
    end = speech_end_offset(x, rate)
    assert end == pytest.approx(1.3, abs=0.005)
    assert speech_end_offset(noise, rate) is None


def test_each_input_gets_the_record_ending_nearest_its_exact_end():
    t0 = 1000.0
    script = [ScriptLine("a", "", np.zeros(1), 2.0), ScriptLine("b", "", np.zeros(1), 1.5)]
    starts = [0.0, 6.0]  # timeline seconds
    # input a: a spurious early end (split utterance) and the real one; input b: one record
    early = TurnRecord(0, speech_end=t0 + 0.9, endpoint=t0 + 1.4)
    real = TurnRecord(1, speech_end=t0 + 2.05, endpoint=t0 + 2.6, asr_final=t0 + 2.9,
                      llm_first_token=t0 + 3.1, tts_first_chunk=t0 + 3.3, first_audio_out=t0 + 3.35)
    b = TurnRecord(2, speech_end=t0 + 7.45, endpoint=t0 + 8.0, asr_final=t0 + 8.5,
                   llm_first_token=t0 + 8.6, tts_first_chunk=t0 + 8.8, first_audio_out=t0 + 8.9)
    rows = match_turns(script, starts, t0, [early, real, b])
    assert [r["records"] for r in rows] == [2, 1]
    assert rows[0]["voice_to_voice_ms"] == pytest.approx(1350.0)
    assert rows[0]["endpoint_ms"] == pytest.approx(600.0)
    assert rows[0]["vad_end_error_ms"] == pytest.approx(50.0)
    assert rows[1]["voice_to_voice_ms"] == pytest.approx(1400.0)
    assert [rows[1][k] for k in STAGE_KEYS] == pytest.approx([500.0, 500.0, 100.0, 200.0, 100.0])
    assert match_turns(script, starts, t0, [early])[1]["voice_to_voice_ms"] is None


def test_a_committed_speculative_turn_has_no_negative_stage():
    """The LLM started on a partial transcript: its first token came before the endpoint and
    the final. That stage reads 0, never a negative time, and the stages add up to v2v."""
    t0 = 1000.0
    script = [ScriptLine("a", "", np.zeros(1), 2.0)]
    rec = TurnRecord(0, speech_end=t0 + 2.02, endpoint=t0 + 2.4, asr_final=t0 + 2.45,
                     llm_first_token=t0 + 2.25, tts_first_chunk=t0 + 2.6, first_audio_out=t0 + 2.62,
                     speculative=True)
    (row,) = match_turns(script, [0.0], t0, [rec])
    stages = [row[k] for k in STAGE_KEYS]
    assert stages == pytest.approx([400.0, 50.0, 0.0, 150.0, 20.0])
    assert sum(stages) == pytest.approx(row["voice_to_voice_ms"]) == pytest.approx(620.0)


@pytest.mark.models
@pytest.mark.skipif(not flite_available() or not DEV.exists(), reason="needs flite and ../shared/speech/dev")
def test_bench_latency_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["--llm", "smollm2-135m", "--turns", "2", "--max-tokens", "24", "--tts", "piper",
               "--modes", "concurrent+trace,waterfall+trace", "--json", str(out), "--work-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    print(printed)
    assert rc == 0
    assert "ratio concurrent/waterfall" in printed and printed.count("voice-to-voice p50") >= 3
    assert printed.count("event-loop lag") == 2 and printed.count("speculation:") == 2

    report = json.loads(out.read_text())
    assert report["config"]["turns"] == 2
    assert report["ratio_p50_concurrent_over_waterfall"] > 0
    for mode in ("concurrent+trace", "waterfall+trace"):
        res = report["modes"][mode]
        rows = res["turns"]
        assert len(rows) == 2 and res["replied"] == 2
        assert "capital" in rows[0]["heard"].lower() and "spider" in rows[1]["heard"].lower()
        for r in rows:
            assert r["voice_to_voice_ms"] > 0 and r["endpoint_ms"] > 0
            assert all(r[k] is not None for k in ("asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms"))
        assert 0 < res["voice_to_voice_p50_ms"] <= res["voice_to_voice_p90_ms"]
        assert all(v is not None for v in res["stages_mean_ms"].values())
        lag = res["loop_lag"]
        assert lag["samples"] > 100 and 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
    # waterfall runs the stages in sequence: every stage takes time
    wf = report["modes"]["waterfall+trace"]["stages_mean_ms"]
    assert all(wf[k] > 0 for k in ("endpoint_ms", "asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms"))
    # partial transcripts flow into the LLM (a prompt warmed with the user's words so far) in
    # concurrent mode only; both modes warm the history and the next user header between turns
    def partial_warms(mode):
        events = [json.loads(line) for line in (tmp_path / f"trace-{mode}.jsonl").read_text().splitlines()[1:]]
        return [e for e in events if e.get("name") == "warm_cache" and e["args"]["user_words"] > 0]
    assert partial_warms("concurrent") and not partial_warms("waterfall")
