"""JSON-lines event log round trip, format detection, optional OTLP export."""
import json

import pytest

from agent.tracing.trace import Tracer
from agent.tracing.export import load_events, read_jsonl, read_meta, write_jsonl
from agent.bench.simulated_turns import simulate_turns


def _key(e):
    return (e.ph, e.ts_ns, e.stage, e.name, e.turn, e.flow, e.dur_ns, e.id, e.session,
            json.dumps(e.args, sort_keys=True))


def test_jsonl_round_trip(tmp_path):
    tr = Tracer("sess/α")
    simulate_turns(tr, 4, speculative_turns=(2,), explicit_flow_turns=(3,))
    with tr.span("llm", "generate", 4, flow=9, model="m", temperature=0.5):
        pass
    tr.instant("asr", "partial", 4, text='quote " and \n newline', words=[["hi", 0.1, 0.2]])
    p = str(tmp_path / "log.jsonl")
    write_jsonl(tr, p)
    lines = open(p, encoding="utf-8").read().splitlines()
    assert all(json.loads(l) is not None for l in lines)  # one JSON value per line
    assert json.loads(lines[0])["meta"]["session"] == "sess/α"
    back = read_jsonl(p)
    orig = tr.events()
    assert len(back) == len(orig) == len(lines) - 1
    assert [_key(e) for e in back] == [_key(e) for e in orig]
    assert back[-1].args["words"] == [["hi", 0.1, 0.2]]
    assert load_events(p) == back
    assert read_meta(p)["wall_offset_ns"] == tr.wall_offset_ns


def test_jsonl_non_json_args_become_strings(tmp_path):
    class Obj:
        def __str__(self):
            return "<obj>"

    tr = Tracer("s")
    tr.instant("llm", "token", 1, obj=Obj(), t=(1, 2))
    p = str(tmp_path / "x.jsonl")
    write_jsonl(tr, p)
    (e,) = load_events(p)
    assert e.args == {"obj": "<obj>", "t": [1, 2]}


def test_load_events_reads_spill_and_log_and_perfetto(tmp_path):
    from agent.tracing.export import write_perfetto

    spill = str(tmp_path / "spill.jsonl")
    tr = Tracer("s", capacity=16, spill_path=spill)
    for i in range(100):
        tr.instant("audio_in", "frame", 1, ts_ns=i)
    tr.flush()
    assert [e.ts_ns for e in load_events(spill)] == list(range(tr.spilled))
    # the full picture: spill + ring written as one log
    log = str(tmp_path / "all.jsonl")
    write_jsonl(tr, log)
    assert [e.ts_ns for e in load_events(log)] == list(range(100))
    pf = str(tmp_path / "all.json")
    write_perfetto(tr, pf)
    assert [e.ts_ns for e in load_events(pf)] == list(range(100))
    tr.close()


def test_otlp_export_uses_genai_conventions():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent.tracing.export import export_otlp

    tr = Tracer("s")
    simulate_turns(tr, 2)
    with tr.span("asr", "step", 2, audio_s=0.08):
        pass
    exp = InMemorySpanExporter()
    n = export_otlp(tr, span_exporter=exp)
    spans = exp.get_finished_spans()
    assert n == len(spans)
    chats = [s for s in spans if s.name.startswith("chat")]
    assert len(chats) == 2
    a = chats[0].attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "smollm2"
    assert a["gen_ai.usage.output_tokens"] > 0
    roots = [s for s in spans if s.name == "turn"]
    assert len(roots) == 2 and all(s.parent is None for s in roots)
    assert all(s.parent is not None for s in chats)
    assert any(ev.name == "turn.endpoint" for ev in roots[0].events)
    assert all(s.end_time >= s.start_time for s in spans)


def test_opentelemetry_is_not_imported_eagerly():
    import subprocess
    import sys

    code = ("import sys, agent.tracing.trace, agent.tracing.export, agent.tracing.report, agent.tracing.profiling;"
            "print(any(m.startswith('opentelemetry') for m in sys.modules), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_trace_file_appears_only_whole(tmp_path):
    """A reader watching the trace directory never sees half a file: a writer that fails leaves
    nothing behind, and one that succeeds replaces the file in one step."""
    from agent.tracing.export import _written_whole

    path = tmp_path / "s.trace.json"
    with pytest.raises(RuntimeError):
        with _written_whole(str(path)) as f:
            f.write('{"traceEvents": [')
            assert not path.exists()  # nothing at the real name while writing
            raise RuntimeError("the writer died")
    assert list(tmp_path.iterdir()) == []
    with _written_whole(str(path)) as f:
        f.write("{}")
    assert path.read_text() == "{}" and list(tmp_path.iterdir()) == [path]
