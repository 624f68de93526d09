"""Exporters for :mod:`agent.tracing.trace` events.

* Chrome/Perfetto trace JSON (:func:`to_perfetto`, :func:`write_perfetto`),
  which opens in ui.perfetto.dev and chrome://tracing:

  - one process (``pid``) per session, named by ``process_name`` metadata;
  - one thread track (``tid``) per stage, named by ``thread_name`` metadata,
    in the order of :data:`agent.tracing.trace.STAGES`.  Spans of one stage that
    overlap without nesting (e.g. a speculative LLM branch next to the
    committed one) go to extra lanes named ``"llm #2"``…, because a thread
    track must hold properly nested slices;
  - spans → ``ph: "X"``, instants → ``ph: "i"`` (thread scope), counters →
    ``ph: "C"`` (``name`` = stage, ``args`` = ``{counter name: value}``);
  - flows (``ph: "s"``/``"t"``/``"f"``) link events with the same ``flow=`` id,
    and, for turns without explicit flows, the turn's causal chain
    ASR partial → LLM request → TTS request → first transport send → client
    playout start.  Perfetto binds a flow arrow to the slice open on the track
    at the flow event's time, so an instant that is a flow endpoint is
    exported as a 1 µs ``"X"`` anchor slice (``args.instant = true``) and the
    flow event is placed inside it;
  - ``ts``/``dur`` are µs (floats, ns precision) relative to the earliest
    event; ``otherData.duplex`` keeps the base and the pid → session map so
    :func:`load_events` restores exact ns timestamps.

* JSON lines (:func:`write_jsonl`, :func:`read_jsonl`): one header line
  ``{"meta": {...}}`` then one record per event (see
  :func:`agent.tracing.trace.event_to_record`).  Tracer spill files use the same
  format (with batched compact lines), so :func:`load_events` reads both.

* OpenTelemetry (:func:`export_otlp`), an optional extra: ``opentelemetry-sdk``
  (and an OTLP exporter package) are imported only when it is called.  One
  root span per turn, a child span per recorded span, GenAI semantic
  convention spans for the LLM (``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.output_tokens`` …) and instants as
  span events.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from typing import Any, Iterable, Sequence

from agent.tracing.trace import (
    STAGES,
    Ev,
    Event,
    Stage,
    Tracer,
    _jsonable,
    event_to_record,
    iter_jsonl,
    JSONL_FORMAT,
)

__all__ = [
    "to_perfetto",
    "validate_perfetto",
    "write_perfetto",
    "write_jsonl",
    "read_jsonl",
    "load_events",
    "flow_chains",
    "export_otlp",
    "stage_tid",
]

ANCHOR_DUR_US = 1.0  # duration of the slice an instant flow endpoint becomes
_LANE_STRIDE = 100  # tid = (stage index + 1) * 100 + lane
_SYNTH_FLOW_BASE = 1 << 40  # synthesized flow ids live above explicit ones


def _as_events(src: Tracer | Iterable[Event]) -> list[Event]:
    if isinstance(src, Tracer):
        return src.events(include_spilled=True)
    return [e if isinstance(e, Event) else Event(*e) for e in src]


def _stage_index(stage: str, extra: dict[str, int]) -> int:
    try:
        return STAGES.index(stage)
    except ValueError:
        if stage not in extra:
            extra[stage] = len(STAGES) + len(extra)
        return extra[stage]


def stage_tid(stage: str, lane: int = 0) -> int:
    """The ``tid`` of a canonical stage's track (lane 0) in the Perfetto export."""
    return (STAGES.index(stage) + 1) * _LANE_STRIDE + lane


# --------------------------------------------------------------------- flows
def _first(evs: Sequence[Event], pred, after: int | None = None) -> Event | None:
    for e in evs:
        if pred(e) and (after is None or e.ts_ns >= after):
            return e
    return None


def _last(evs: Sequence[Event], pred, before: int | None = None) -> Event | None:
    out = None
    for e in evs:
        if pred(e) and (before is None or e.ts_ns <= before):
            out = e
    return out


def _is(stage: str, *names: str):
    return lambda e: e.stage == stage and e.name in names and e.ph != "C"


def turn_chain(turn_events: Sequence[Event]) -> list[Event]:
    """The causal chain of one turn: the ASR hypothesis the reply was started
    from → the LLM request that fed TTS → the first TTS request → the first
    transport send after it → the client's playout start.  Missing links are
    skipped.  ``turn_events`` must be sorted by time."""
    evs = turn_events
    tts_req = _first(evs, _is(Stage.TTS, Ev.REQUEST))
    if tts_req is not None:
        req = _last(evs, _is(Stage.LLM, Ev.REQUEST), before=tts_req.ts_ns) or _first(
            evs, _is(Stage.LLM, Ev.REQUEST)
        )
    else:
        req = _first(evs, _is(Stage.LLM, Ev.REQUEST))
    if req is not None and tts_req is not None and tts_req.ts_ns < req.ts_ns:
        tts_req = _first(evs, _is(Stage.TTS, Ev.REQUEST), after=req.ts_ns)
    anchor = req or tts_req
    src = _last(evs, _is(Stage.ASR, Ev.PARTIAL, Ev.FINAL), before=anchor.ts_ns if anchor else None)
    after = (tts_req or req or src).ts_ns if (tts_req or req or src) else None
    send = _first(evs, _is(Stage.TRANSPORT, Ev.SEND_AUDIO), after=after)
    play = _first(
        evs, _is(Stage.CLIENT, Ev.PLAYOUT_START), after=(send or tts_req or req or src).ts_ns
        if (send or tts_req or req or src) else None
    )
    return [e for e in (src, req, tts_req, send, play) if e is not None]


def flow_chains(events: Iterable[Event]) -> list[tuple[int, list[Event]]]:
    """Flow groups as ``(flow id, events sorted by time)``.

    Events sharing an explicit ``flow=`` id (per session) form one group.  Each
    turn without any explicit flow gets a synthesized group from
    :func:`turn_chain` (ids at and above ``1 << 40``).  Groups with fewer than
    two events are dropped.
    """
    evs = sorted((e for e in events if e.ph != "C"), key=lambda e: e.ts_ns)
    explicit: dict[tuple[str, int], list[Event]] = defaultdict(list)
    turns: dict[tuple[str, int], list[Event]] = defaultdict(list)
    turns_with_flow: set[tuple[str, int]] = set()
    for e in evs:
        if e.flow is not None:
            explicit[(e.session, e.flow)].append(e)
            if e.turn is not None:
                turns_with_flow.add((e.session, e.turn))
        if e.turn is not None:
            turns[(e.session, e.turn)].append(e)
    out: list[tuple[int, list[Event]]] = []
    sessions = {s for s, _ in list(explicit) + list(turns)}
    sess_idx = {s: i for i, s in enumerate(sorted(sessions))}
    n_sess = max(1, len(sess_idx))
    for (s, f), group in explicit.items():
        if len(group) >= 2:
            out.append((f * n_sess + sess_idx[s] + 1 if n_sess > 1 else f, group))
    for (s, t), group in turns.items():
        if (s, t) in turns_with_flow:
            continue
        chain = turn_chain(group)
        if len(chain) >= 2:
            out.append((_SYNTH_FLOW_BASE + (t * n_sess + sess_idx[s]), chain))
    return out


# ------------------------------------------------------------------ perfetto
def to_perfetto(
    events: Tracer | Iterable[Event],
    *,
    base_ns: int | None = None,
    flows: bool = True,
) -> dict:
    """Build a Chrome/Perfetto trace (``{"traceEvents": [...], ...}``)."""
    evs = _as_events(events)
    evs.sort(key=lambda e: (e.ts_ns, -e.dur_ns))
    if base_ns is None:
        base_ns = min((e.ts_ns for e in evs), default=0)
    pids: dict[str, int] = {}
    for e in evs:
        if e.session not in pids:
            pids[e.session] = len(pids) + 1
    extra_stages: dict[str, int] = {}

    def us(ns: int) -> float:
        return (ns - base_ns) / 1000.0

    chains = flow_chains(evs) if flows else []
    anchors: set[int] = set()  # id() of instants that must become slices
    for _, grp in chains:
        for e in grp:
            if e.ph == "i":
                anchors.add(id(e))

    # Lane assignment: slices on one thread track must nest properly.
    lanes: dict[tuple[int, str], list[list[float]]] = defaultdict(list)
    placed: dict[int, int] = {}  # id(event) -> tid
    used_tids: dict[tuple[int, int], tuple[str, int]] = {}
    out: list[dict] = []
    for e in evs:
        pid = pids[e.session]
        sidx = _stage_index(e.stage, extra_stages)
        base_tid = (sidx + 1) * _LANE_STRIDE
        if e.ph == "C":
            v = e.args.get("value") if isinstance(e.args, dict) else None
            out.append(
                {"ph": "C", "name": e.stage, "cat": e.stage, "ts": us(e.ts_ns),
                 "pid": pid, "tid": base_tid, "args": {e.name: v}}
            )
            used_tids[(pid, base_tid)] = (e.stage, 0)
            continue
        args: dict[str, Any] = {}
        if e.turn is not None:
            args["turn"] = e.turn
        if e.flow is not None:
            args["flow"] = e.flow
        if e.args:
            args.update(_jsonable(e.args))
        is_anchor = id(e) in anchors
        if e.ph == "X" or is_anchor:
            start = e.ts_ns
            end = e.ts_ns + (e.dur_ns if e.ph == "X" else int(ANCHOR_DUR_US * 1000))
            stacks = lanes[(pid, e.stage)]
            lane = None
            for li, st in enumerate(stacks):
                while st and st[-1] <= start:
                    st.pop()
                if not st or st[-1] >= end:
                    lane = li
                    st.append(end)
                    break
            if lane is None:
                stacks.append([end])
                lane = len(stacks) - 1
            tid = base_tid + lane
            ev = {"ph": "X", "name": e.name, "cat": e.stage, "ts": us(start),
                  "dur": (end - start) / 1000.0, "pid": pid, "tid": tid}
            if e.ph == "X":
                args["span_id"] = e.id
            else:
                args["instant"] = True
            ev["args"] = args
        else:
            lane = 0
            tid = base_tid
            ev = {"ph": "i", "s": "t", "name": e.name, "cat": e.stage,
                  "ts": us(e.ts_ns), "pid": pid, "tid": tid, "args": args}
        placed[id(e)] = tid
        used_tids[(pid, tid)] = (e.stage, lane)
        out.append(ev)

    flow_events: list[dict] = []
    for fid, grp in chains:
        last = len(grp) - 1
        for k, e in enumerate(grp):
            dur_ns = e.dur_ns if e.ph == "X" else int(ANCHOR_DUR_US * 1000)
            inside = min(500, dur_ns // 2)  # ns into the bound slice
            fe = {"ph": "s" if k == 0 else ("f" if k == last else "t"),
                  "id": fid, "name": "turn" if fid >= _SYNTH_FLOW_BASE else "flow",
                  "cat": "flow", "ts": us(e.ts_ns + inside),
                  "pid": pids[e.session], "tid": placed[id(e)]}
            if k == last:
                fe["bp"] = "e"
            flow_events.append(fe)

    meta: list[dict] = []
    for sess, pid in pids.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": f"duplex session {sess}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    for (pid, tid), (stage, lane) in sorted(used_tids.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                     "args": {"name": stage if lane == 0 else f"{stage} #{lane + 1}"}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    trace_events = meta + out + flow_events
    duplex: dict[str, Any] = {"format": "duplex-perfetto/1", "base_ns": base_ns,
                              "sessions": {str(pid): sess for sess, pid in pids.items()}}
    if isinstance(events, Tracer):  # to line the trace up with logs and other machines' clocks
        duplex["wall_offset_ns"] = events.wall_offset_ns
    return {"traceEvents": trace_events, "displayTimeUnit": "ms", "otherData": {"duplex": duplex}}


_NUM = (int, float)
_REQUIRED: dict[str, dict[str, Any]] = {
    "X": {"name": str, "cat": str, "ts": _NUM, "dur": _NUM, "pid": int, "tid": int, "args": dict},
    "i": {"name": str, "cat": str, "ts": _NUM, "pid": int, "tid": int, "s": str, "args": dict},
    "C": {"name": str, "ts": _NUM, "pid": int, "tid": int, "args": dict},
    "s": {"name": str, "cat": str, "ts": _NUM, "pid": int, "tid": int, "id": int},
    "t": {"name": str, "cat": str, "ts": _NUM, "pid": int, "tid": int, "id": int},
    "f": {"name": str, "cat": str, "ts": _NUM, "pid": int, "tid": int, "id": int},
    "M": {"name": str, "pid": int, "tid": int, "args": dict},
}


def validate_perfetto(doc: Any) -> list[str]:
    """Schema-check a Chrome/Perfetto JSON trace as this module writes it.

    Returns a list of problems (empty when valid): required fields and their
    types per phase, non-negative durations, instant scope, numeric counter
    values, every flow id with exactly one ``s`` and one ``f`` in time order,
    and a ``thread_name`` for every track that carries events.  Usable by
    integration tests on a real session's trace.
    """
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents list"]
    flows: dict[Any, list[tuple[float, str]]] = defaultdict(list)
    named: set[tuple[Any, Any]] = set()
    used: set[tuple[Any, Any]] = set()
    for k, te in enumerate(doc["traceEvents"]):
        ph = te.get("ph") if isinstance(te, dict) else None
        if ph not in _REQUIRED:
            errs.append(f"{k}: unknown ph {ph!r}")
            continue
        ok = True
        for field, typ in _REQUIRED[ph].items():
            if field not in te:
                errs.append(f"{k}: {ph} lacks {field}")
                ok = False
            elif not isinstance(te[field], typ) or isinstance(te[field], bool):
                errs.append(f"{k}: {ph}.{field} has type {type(te[field]).__name__}")
                ok = False
        if not ok:
            continue
        if ph == "X" and te["dur"] < 0:
            errs.append(f"{k}: negative dur")
        if ph == "i" and te["s"] not in ("t", "p", "g"):
            errs.append(f"{k}: bad instant scope")
        if ph == "C" and (not te["args"] or not all(
                isinstance(v, _NUM) and not isinstance(v, bool) for v in te["args"].values())):
            errs.append(f"{k}: counter args must be numbers")
        if ph == "f" and te.get("bp") not in (None, "e"):
            errs.append(f"{k}: bad bp")
        if ph == "M":
            if te["name"] in ("process_name", "thread_name") and not isinstance(
                    te["args"].get("name"), str):
                errs.append(f"{k}: metadata without a name")
            if te["name"] == "thread_name":
                named.add((te["pid"], te["tid"]))
        elif ph in ("s", "t", "f"):
            flows[(te["cat"], te["name"], te["id"])].append((te["ts"], ph))
            used.add((te["pid"], te["tid"]))
        else:
            used.add((te["pid"], te["tid"]))
    for key, steps in flows.items():
        phs = [p for _, p in steps]
        if phs.count("s") != 1 or phs.count("f") != 1:
            errs.append(f"flow {key}: needs one 's' and one 'f', has {phs}")
            continue
        ts_s = next(t for t, p in steps if p == "s")
        ts_f = next(t for t, p in steps if p == "f")
        if ts_f < ts_s or any(not ts_s <= t <= ts_f for t, p in steps if p == "t"):
            errs.append(f"flow {key}: steps out of time order")
    for track in sorted(used - named):
        errs.append(f"track {track}: no thread_name")
    return errs


@contextlib.contextmanager
def _written_whole(path: str):
    """A text file that appears at `path` only once it is complete (written beside it, then
    renamed): whoever watches the trace directory never reads half a trace."""
    _mkdir_for(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_perfetto(events: Tracer | Iterable[Event], path: str, **kw: Any) -> str:
    """Write a Perfetto/Chrome trace JSON file; returns ``path``."""
    doc = to_perfetto(events, **kw)
    with _written_whole(path) as f:
        json.dump(doc, f, separators=(",", ":"))
    return path


def write_trace(tracer: Tracer, path: str) -> None:
    """A session's trace as Perfetto JSON at `path`, and as JSON lines beside it."""
    write_perfetto(tracer, path)
    write_jsonl(tracer, path.removesuffix(".json") + ".jsonl")


def _from_perfetto(doc: dict | list) -> list[Event]:
    if isinstance(doc, list):
        tes, other = doc, {}
    else:
        tes, other = doc.get("traceEvents", []), doc.get("otherData", {}) or {}
    dmeta = other.get("duplex", {}) if isinstance(other, dict) else {}
    base = int(dmeta.get("base_ns", 0))
    sessions = {int(k): v for k, v in dmeta.get("sessions", {}).items()}
    for te in tes:
        if te.get("ph") == "M" and te.get("name") == "process_name":
            pid = te.get("pid")
            if pid not in sessions:
                nm = str(te.get("args", {}).get("name", pid))
                sessions[pid] = nm.removeprefix("duplex session ")

    def ns(us_val: float) -> int:
        return base + int(round(float(us_val) * 1000.0))

    out: list[Event] = []
    for te in tes:
        ph = te.get("ph")
        if ph not in ("X", "i", "I", "C"):
            continue
        sess = sessions.get(te.get("pid"), str(te.get("pid", "")))
        args = dict(te.get("args") or {})
        if ph == "C":
            for k, v in args.items():
                out.append(Event("C", ns(te["ts"]), te.get("name", ""), k, None, None,
                                 {"value": v}, 0, 0, sess))
            continue
        turn = args.pop("turn", None)
        flow = args.pop("flow", None)
        stage = te.get("cat", "")
        if ph == "X" and not args.pop("instant", False):
            sid = int(args.pop("span_id", 0))
            out.append(Event("X", ns(te["ts"]), stage, te.get("name", ""), turn, flow, args,
                             int(round(float(te.get("dur", 0)) * 1000.0)), sid, sess))
        else:
            out.append(Event("i", ns(te["ts"]), stage, te.get("name", ""), turn, flow, args,
                             0, 0, sess))
    out.sort(key=lambda e: e.ts_ns)
    return out


# --------------------------------------------------------------------- jsonl
def write_jsonl(
    events: Tracer | Iterable[Event], path: str, *, session: str | None = None
) -> str:
    """Write the JSON-lines event log; returns ``path``."""
    tracer = events if isinstance(events, Tracer) else None
    evs = _as_events(events)
    meta: dict[str, Any] = {"format": JSONL_FORMAT}
    if tracer is not None:
        meta.update(session=tracer.session_id, wall_offset_ns=tracer.wall_offset_ns,
                    client_offset_ns=tracer.clock_offset())
    elif session is not None:
        meta["session"] = session
    enc = json.JSONEncoder(separators=(",", ":"), default=str)
    with _written_whole(path) as f:
        f.write(enc.encode({"meta": meta}) + "\n")
        for e in evs:
            f.write(enc.encode(event_to_record(e)) + "\n")
    return path


def read_jsonl(path: str) -> list[Event]:
    return list(iter_jsonl(path))


def read_meta(path: str) -> dict:
    """Merged ``meta`` headers of a JSONL file, or ``otherData.duplex`` of a Perfetto file."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    try:
        obj = json.loads(first)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and "meta" in obj:
        return dict(obj["meta"])
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return dict((doc.get("otherData") or {}).get("duplex", {})) if isinstance(doc, dict) else {}


def load_events(path: str) -> list[Event]:
    """Read events back from a JSONL log/spill file or a Perfetto JSON trace."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
        rest = f.read(1)
    try:
        obj = json.loads(first)
    except ValueError:
        obj = None
    if isinstance(obj, list) and obj and isinstance(obj[0], list):
        return read_jsonl(path)  # spill file starting with a batch
    if isinstance(obj, dict) and ("meta" in obj or ("ph" in obj and "ts_ns" in obj)):
        if "traceEvents" not in obj:
            return read_jsonl(path)
    if isinstance(obj, dict) and "traceEvents" in obj and not rest:
        return _from_perfetto(obj)
    with open(path, encoding="utf-8") as f:
        return _from_perfetto(json.load(f))


def _mkdir_for(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)


# ---------------------------------------------------------------------- otlp
def export_otlp(
    events: Tracer | Iterable[Event],
    *,
    endpoint: str | None = None,
    span_exporter: Any = None,
    service_name: str = "duplex",
    wall_offset_ns: int | None = None,
    model: str | None = None,
    provider_name: str | None = None,
) -> int:
    """Send the trace as OpenTelemetry spans; returns the number of spans.

    Requires the optional extra ``opentelemetry-sdk`` (imported here, lazily).
    ``span_exporter`` is any ``SpanExporter`` (e.g. the SDK's
    ``InMemorySpanExporter`` or ``ConsoleSpanExporter``); otherwise an OTLP
    exporter is built for ``endpoint`` (``opentelemetry-exporter-otlp-proto-http``,
    or ``-grpc``).

    Span layout per turn: a root ``turn`` span (first → last event of the
    turn) with instants as span events; child spans for every recorded span;
    and one GenAI ``chat {model}`` span per LLM request (request → done or
    cancel) with ``gen_ai.operation.name``, ``gen_ai.request.model``,
    (a tool call's span is GenAI's ``execute_tool {name}`` with ``gen_ai.tool.name``),
    ``gen_ai.provider.name``/``gen_ai.system`` and ``gen_ai.usage.output_tokens``
    (token events counted when the backend did not report usage).  Events
    outside any turn go under a ``session`` root span.
    """
    try:
        from opentelemetry import trace as ot_trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ImportError(
            "OpenTelemetry export needs the optional extra: pip install opentelemetry-sdk "
            "opentelemetry-exporter-otlp-proto-http"
        ) from e

    tracer_obj = events if isinstance(events, Tracer) else None
    evs = _as_events(events)
    evs.sort(key=lambda e: e.ts_ns)
    if wall_offset_ns is None:
        if tracer_obj is not None:
            wall_offset_ns = tracer_obj.wall_offset_ns
        else:
            import time as _time

            wall_offset_ns = _time.time_ns() - (evs[-1].ts_ns if evs else 0)
    if span_exporter is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        span_exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    otel = provider.get_tracer("duplex.agent.trace")

    def w(ns: int) -> int:
        return int(ns + wall_offset_ns)

    def attrs(d: dict) -> dict:
        o = {}
        for k, v in (d or {}).items():
            v = _jsonable(v)
            if isinstance(v, (bool, int, float, str)):
                o[f"duplex.{k}"] = v
            elif v is not None:
                o[f"duplex.{k}"] = json.dumps(v)
        return o

    groups: dict[tuple[str, int | None], list[Event]] = defaultdict(list)
    for e in evs:
        groups[(e.session, e.turn)].append(e)
    n_spans = 0
    for (sess, turn), grp in sorted(groups.items(), key=lambda kv: kv[1][0].ts_ns):
        t0 = grp[0].ts_ns
        t1 = max(e.ts_ns + e.dur_ns for e in grp)
        root_attrs = {"session.id": sess, "duplex.session_id": sess}
        if turn is not None:
            root_attrs["duplex.turn"] = turn
        root = otel.start_span("turn" if turn is not None else "session",
                               start_time=w(t0), attributes=root_attrs)
        ctx = ot_trace.set_span_in_context(root)
        open_llm: list[tuple[Event, list[Event]]] = []
        for e in grp:
            if e.ph == "X":
                a = {"duplex.stage": e.stage, **attrs(e.args)}
                if e.stage == Stage.LLM:
                    a["gen_ai.operation.name"] = "chat"
                    m = e.args.get("model", model)
                    if m:
                        a["gen_ai.request.model"] = str(m)
                name = f"{e.stage}.{e.name}"
                if e.stage == Stage.TOOL and e.name == Ev.TOOL_CALL:  # GenAI's tool-execution span
                    a["gen_ai.operation.name"] = "execute_tool"
                    a["gen_ai.tool.name"] = str(e.args.get("tool", ""))
                    name = f"execute_tool {e.args.get('tool', '')}"
                sp = otel.start_span(name, context=ctx, start_time=w(e.ts_ns), attributes=a)
                sp.end(end_time=w(e.ts_ns + e.dur_ns))
                n_spans += 1
            elif e.ph == "C":
                root.add_event(f"{e.stage}.{e.name}", {"value": float(e.args.get("value", 0.0))},
                               timestamp=w(e.ts_ns))
            else:
                if e.name != Ev.TOKEN:
                    root.add_event(f"{e.stage}.{e.name}", attrs(e.args), timestamp=w(e.ts_ns))
                if e.stage == Stage.LLM:
                    if e.name == Ev.REQUEST:
                        open_llm.append((e, []))
                    elif open_llm and e.name in (Ev.FIRST_TOKEN, Ev.TOKEN):
                        open_llm[-1][1].append(e)
                    elif open_llm and e.name in (Ev.DONE, Ev.CANCEL):
                        req, toks = open_llm.pop(0)
                        n_spans += _gen_ai_span(otel, ctx, req, toks, e, w, model, provider_name)
        for req, toks in open_llm:  # never finished: end at the last token or request
            endev = toks[-1] if toks else req
            n_spans += _gen_ai_span(otel, ctx, req, toks, endev, w, model, provider_name)
        root.end(end_time=w(t1))
        n_spans += 1
    provider.force_flush()
    provider.shutdown()
    return n_spans


def _gen_ai_span(otel, ctx, req: Event, toks: list[Event], end: Event, w, model, provider_name) -> int:
    m = req.args.get("model", model)
    a: dict[str, Any] = {"gen_ai.operation.name": "chat", "duplex.stage": Stage.LLM}
    if m:
        a["gen_ai.request.model"] = str(m)
    prov = req.args.get("provider", provider_name)
    if prov:
        a["gen_ai.provider.name"] = str(prov)
        a["gen_ai.system"] = str(prov)
    for key in ("max_tokens", "temperature", "top_p"):
        if key in req.args:
            a[f"gen_ai.request.{key}"] = req.args[key]
    out_tok = end.args.get("output_tokens", end.args.get("tokens"))
    if out_tok is None:
        out_tok = sum(1 for t in toks if t.name == Ev.TOKEN)
    a["gen_ai.usage.output_tokens"] = int(out_tok)
    in_tok = end.args.get("input_tokens", req.args.get("input_tokens"))
    if in_tok is not None:
        a["gen_ai.usage.input_tokens"] = int(in_tok)
    if end.name == Ev.CANCEL:
        a["gen_ai.response.finish_reasons"] = ["cancelled"]
    ft = next((t for t in toks if t.name == Ev.FIRST_TOKEN), None)
    if ft is not None:
        a["duplex.ttft_ms"] = (ft.ts_ns - req.ts_ns) / 1e6
    sp = otel.start_span(f"chat {m}" if m else "chat", context=ctx, start_time=w(req.ts_ns),
                         attributes=a)
    if ft is not None:
        sp.add_event("gen_ai.first_token", timestamp=w(ft.ts_ns))
    sp.end(end_time=w(max(end.ts_ns, req.ts_ns)))
    return 1
