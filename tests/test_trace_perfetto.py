"""Perfetto/Chrome trace export: schema, tracks, flows, causal order."""
import json
import os
from collections import defaultdict

import pytest

from agent.tracing.trace import STAGES, Tracer
from agent.tracing.export import load_events, read_meta, to_perfetto, validate_perfetto, write_perfetto
from agent.bench.simulated_turns import simulate_turns

N_TURNS = 6
SPEC, BARGE, EXPLICIT = (2, 5), (3,), (4,)

def _session(sid="s1", **kw):
    tr = Tracer(sid)
    simulate_turns(tr, N_TURNS, speculative_turns=SPEC, barge_in_turns=BARGE,
                   explicit_flow_turns=EXPLICIT, **kw)
    return tr


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    p = tmp_path_factory.mktemp("pf") / "trace.json"
    write_perfetto(_session(), str(p))
    with open(p) as f:
        return json.load(f)  # what ui.perfetto.dev would read


validate = validate_perfetto


def test_schema_valid(doc):
    assert validate(doc) == []
    json.dumps(doc)  # serialisable as-is


def test_validator_catches_bad_events(doc):
    bad = json.loads(json.dumps(doc))
    x = next(te for te in bad["traceEvents"] if te["ph"] == "X")
    del x["dur"]
    bad["traceEvents"].append({"ph": "i", "name": "a", "cat": "b", "ts": "1", "pid": 1, "tid": 1,
                               "s": "t", "args": {}})
    f = next(te for te in bad["traceEvents"] if te["ph"] == "f")
    bad["traceEvents"].remove(f)  # an unpaired flow
    bad["traceEvents"].append({"ph": "X", "name": "a", "cat": "b", "ts": 1, "dur": 1, "pid": 9,
                               "tid": 9, "args": {}})  # a track with no thread_name
    errs = validate(bad)
    assert any("lacks dur" in e for e in errs) and any("ts has type str" in e for e in errs)
    assert any("needs one 's' and one 'f'" in e for e in errs)
    assert any("no thread_name" in e for e in errs)


def test_one_process_per_session_and_one_track_per_stage():
    t1, t2 = _session("a"), _session("b")
    doc = to_perfetto(t1.events() + t2.events())
    tes = doc["traceEvents"]
    procs = {te["pid"]: te["args"]["name"] for te in tes if te["ph"] == "M" and te["name"] == "process_name"}
    assert sorted(procs.values()) == ["duplex session a", "duplex session b"]
    threads = {(te["pid"], te["tid"]): te["args"]["name"] for te in tes
               if te["ph"] == "M" and te["name"] == "thread_name"}
    for pid in procs:
        names = {n for (p, _), n in threads.items() if p == pid}
        # every stage the session used has its own named track
        for stage in ("audio_in", "vad", "turn", "asr", "llm", "tts", "transport", "client",
                      "speculation", "memory"):
            assert stage in names, (stage, names)
    # every event sits on a named track, and on the track of its own stage
    for te in tes:
        if te["ph"] in ("X", "i"):
            name = threads[(te["pid"], te["tid"])]
            assert name.split(" #")[0] == te["cat"], (te, name)
        if te["ph"] in ("X", "i", "C", "s", "t", "f"):
            assert (te["pid"], te["tid"]) in threads
    # lane-0 tids follow the STAGES order
    lane0 = sorted((tid, n) for (p, tid), n in threads.items() if p == 1 and "#" not in n)
    assert [n for _, n in lane0] == [s for s in STAGES if s in {n for _, n in lane0}]


def test_slices_nest_properly_per_track(doc):
    by_track = defaultdict(list)
    for te in doc["traceEvents"]:
        if te["ph"] == "X":
            by_track[(te["pid"], te["tid"])].append((te["ts"], te["ts"] + te["dur"]))
    assert by_track
    for track, sl in by_track.items():
        sl.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for s, e in sl:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1] + 1e-9, f"improper nesting on {track}"
            stack.append(e)


def _flows(doc):
    flows = defaultdict(list)
    for te in doc["traceEvents"]:
        if te["ph"] in ("s", "t", "f"):
            flows[(te["cat"], te["name"], te["id"])].append(te)
    return flows


def _slice_at(doc, pid, tid, ts):
    """The innermost X slice on (pid, tid) that contains ts (what Perfetto binds a flow to)."""
    best = None
    for te in doc["traceEvents"]:
        if te["ph"] == "X" and te["pid"] == pid and te["tid"] == tid and te["ts"] <= ts <= te["ts"] + te["dur"]:
            if best is None or te["dur"] < best["dur"]:
                best = te
    return best


def test_flows_paired_and_bound_to_slices(doc):
    flows = _flows(doc)
    assert len(flows) == N_TURNS  # one causal chain per turn
    for key, evs in flows.items():
        phs = [e["ph"] for e in evs]
        assert phs.count("s") == 1 and phs.count("f") == 1, key
        assert phs[0] == "s" and phs[-1] == "f"
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), "flow goes back in time"
        for e in evs:
            assert _slice_at(doc, e["pid"], e["tid"], e["ts"]) is not None, ("unbound flow", e)


def test_flow_chain_is_partial_llm_tts_playout_in_causal_order(doc):
    for key, evs in _flows(doc).items():
        bound = [_slice_at(doc, e["pid"], e["tid"], e["ts"]) for e in evs]
        names = [(b["cat"], b["name"]) for b in bound]
        turns = {b["args"]["turn"] for b in bound}
        assert len(turns) == 1, "flow crosses turns"
        assert names[0][0] == "asr" and names[0][1] in ("partial", "final")
        assert names[-1] == ("client", "playout_start")
        for step in [("llm", "request"), ("tts", "request"), ("transport", "send_audio")]:
            assert step in names, names
        rank = ["asr", "llm", "tts", "transport", "client"]
        ranks = [rank.index(c) for c, _ in names]
        assert ranks == sorted(ranks), names  # causal: never flows back up the pipeline
        if turns == {1}:  # synthesized chain (no explicit flow ids in this turn)
            assert names[1:] == [("llm", "request"), ("tts", "request"),
                                 ("transport", "send_audio"), ("client", "playout_start")], names


def test_every_turn_has_every_stage_in_causal_order(doc):
    per_turn = defaultdict(lambda: defaultdict(list))
    for te in doc["traceEvents"]:
        if te["ph"] in ("X", "i") and "turn" in te["args"]:
            per_turn[te["args"]["turn"]][(te["cat"], te["name"])].append(te["ts"])
    assert sorted(per_turn) == list(range(1, N_TURNS + 1))
    for turn, d in per_turn.items():
        for stage in ("audio_in", "vad", "turn", "asr", "llm", "tts", "transport", "client"):
            assert any(c == stage for c, _ in d), (turn, stage)
        first = lambda k: min(d[k])  # noqa: E731
        # user speech → recognition → reply → audio out → heard
        assert first(("turn", "user_speech_start")) <= first(("asr", "partial"))
        assert first(("turn", "user_speech_start")) <= first(("turn", "user_speech_end"))
        assert first(("turn", "user_speech_end")) <= first(("turn", "endpoint"))
        assert first(("llm", "request")) <= first(("llm", "first_token")) <= max(d[("llm", "done")])
        assert max(d[("llm", "request")]) <= first(("tts", "request")) <= first(("tts", "first_chunk"))
        assert first(("tts", "first_chunk")) <= first(("transport", "send_audio"))
        assert first(("transport", "send_audio")) <= first(("client", "playout_start"))
        assert first(("client", "playout_start")) <= first(("client", "playout_end"))
        assert max(ts for k, v in d.items() for ts in v if k[0] != "client") <= first(("turn", "turn_end"))
        if turn in SPEC:
            assert first(("llm", "request")) < first(("turn", "endpoint"))  # started speculatively
            assert ("speculation", "commit") in d


def test_round_trip_through_perfetto_json(tmp_path):
    tr = _session()
    p = str(tmp_path / "t.json")
    write_perfetto(tr, p)
    back = load_events(p)
    orig = sorted(tr.events(), key=lambda e: (e.ts_ns, e.stage, e.name))
    back = sorted(back, key=lambda e: (e.ts_ns, e.stage, e.name))
    assert len(back) == len(orig)
    for a, b in zip(orig, back):
        assert (a.ph, a.ts_ns, a.stage, a.name, a.turn, a.flow, a.dur_ns, a.session) == (
            b.ph, b.ts_ns, b.stage, b.name, b.turn, b.flow, b.dur_ns, b.session)
        assert a.args == b.args
    # the tracer's clock against wall time travels too: a reader lines the trace up with logs
    assert read_meta(p)["wall_offset_ns"] == tr.wall_offset_ns


@pytest.mark.skipif(not os.environ.get("TRACE_PROCESSOR_SHELL"),
                    reason="set TRACE_PROCESSOR_SHELL to a trace_processor_shell binary")
def test_loads_in_perfetto_trace_processor(tmp_path):  # pragma: no cover - optional
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    p = str(tmp_path / "t.json")
    write_perfetto(_session(), p)
    tp = tp_mod.TraceProcessor(trace=p, config=tp_mod.TraceProcessorConfig(
        bin_path=os.environ["TRACE_PROCESSOR_SHELL"]))
    n_flow = tp.query("select count(*) as n from flow").as_pandas_dataframe()["n"][0]
    threads = set(tp.query("select name from thread").as_pandas_dataframe()["name"])
    tp.close()
    assert n_flow >= 4 * N_TURNS
    assert {"asr", "llm", "tts", "transport", "client"} <= threads
