"""``duplex trace report TRACE [--png-dir DIR]``: where did each millisecond go.

Reads a trace (JSONL event log, tracer spill file or Perfetto JSON; see
:func:`agent.tracing.export.load_events`) and prints:

1. **A per-turn table.**  Milestones, in causal order::

       turn.user_speech_end → turn.endpoint → asr.final → llm.first_token
       → tts.first_chunk → transport.send_audio (first) → client.playout_start

   Each column is the difference between consecutive milestones, computed by
   :func:`agent.tracing.stages.breakdown` (the same function as the session's own
   records and ``duplex bench latency``):

   ============== ===========================================================
   endpoint wait  user_speech_end → endpoint (end-of-turn decision)
   ASR final lag  endpoint → asr.final
   LLM TTFT       asr.final → llm.first_token
   TTS first      llm.first_token → tts.first_chunk
   transport      tts.first_chunk → first transport.send_audio
   client playout first send_audio → client.playout_start (page clock,
                  aligned to the server clock)
   total          the sum of the columns (first → last milestone present)
   ============== ===========================================================

   Each milestone is clamped to be >= the previous one (speculation can start
   the LLM before the endpoint; that stage then shows 0 ms), so the columns
   sum to the total.  A missing milestone leaves its column empty and the
   next column is measured from the last milestone present.  The reply
   that was actually played is chosen backwards from the first
   ``send_audio``: the last ``tts.first_chunk`` before it, the last
   ``llm.first_token`` before that (events sharing the send's ``flow`` id are
   preferred), so cancelled speculative branches do not count.  ``server`` is
   the total up to the first send (voice-to-voice on the server);
   ``mouth→ear`` is the total up to the client's playout start.

2. **p50 / p90 / p99** of every column over turns.

3. **Per-stage RTF and a verdict** for the model stages (asr, llm, tts):

   * *busy* = union of the time the stage was working: its spans; without
     spans, one interval per piece of work from instants: ``llm`` request →
     done/cancel, ``tts`` request → the chunk of that piece (or cancel).  The
     voice's time from a chunk to the next request is not busy: it waits for
     the LLM's next words (and for the playout), so it counts neither in the
     RTF nor in the busy fraction;
   * *window* = per turn, first → last event of the stage (the wall time the
     stage covered);
   * *RTF* = busy / audio seconds covered (``audio_s=``, or ``samples`` /
     ``sample_rate``, on the spans when they carry it, else on the instants,
     e.g. tts chunks); when no audio length is recorded, busy / window
     ("wall RTF");
   * verdict, first rule that matches:

     1. the stage ran on the GPU (``device="cuda..."`` or ``gpu_busy_ns`` on
        its spans): **GPU-bound** if the device was busy >= 50% of the
        window (``gpu_busy_ns`` / window, or busy / window) — compute-bound —
        else **waiting** (the GPU is starved, idle between steps);
     2. busy < 25% of the window: **waiting** (the stage idles for input);
     3. spans flagged ``io=True``, or thread CPU time ``cpu_ns`` < 50% of
        busy time: **I/O-bound** (blocked on a socket, HTTP peer or disk);
     4. otherwise **CPU-bound**.

   Plus the trend of each ``memory`` counter (RSS, GPU memory) in MB/min, a
   leak indicator, measured after warm-up (see :func:`warmup_end_ns`): models
   fault their weights in and allocate their buffers on first use, which is
   not growth.

4. With ``--png-dir``: one waterfall PNG per turn (matplotlib, Agg canvas).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np

from agent.tracing.stages import STAGE_KEYS, breakdown, clamped
from agent.tracing.trace import Ev, Event, Stage, record_to_event

__all__ = [
    "MILESTONES",
    "COLUMNS",
    "turn_table",
    "percentiles",
    "stage_stats",
    "memory_trend",
    "warmup_end_ns",
    "format_table",
    "format_stages",
    "write_waterfalls",
    "main",
]

#: (stage, name) of each milestone, in causal order: agent.tracing.stages.MILESTONES, then the
#: client's playout start.
MILESTONES: tuple[tuple[str, str], ...] = (
    (Stage.TURN, Ev.USER_SPEECH_END),
    (Stage.TURN, Ev.ENDPOINT),
    (Stage.ASR, Ev.FINAL),
    (Stage.LLM, Ev.FIRST_TOKEN),
    (Stage.TTS, Ev.FIRST_CHUNK),
    (Stage.TRANSPORT, Ev.SEND_AUDIO),
    (Stage.CLIENT, Ev.PLAYOUT_START),
)

#: (row key, header) of each stage column; column i spans milestone i → i+1.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("endpoint_wait_ms", "endpoint wait"),
    ("asr_final_lag_ms", "ASR final lag"),
    ("llm_ttft_ms", "LLM TTFT"),
    ("tts_first_chunk_ms", "TTS first chunk"),
    ("transport_ms", "transport"),
    ("client_playout_ms", "client playout"),
)
# the report's column keys (its JSON output) for the keys of agent.tracing.stages.breakdown
_BREAKDOWN_KEYS = (*STAGE_KEYS, "client_playout_ms")

MODEL_STAGES = (Stage.ASR, Stage.LLM, Stage.TTS)

#: Stages whose busy time, without spans, comes from instants: the event that hands the stage a
#: piece of work and the events that end it.  The voice's piece ends at its audio chunk; from
#: there to the next request it waits for the LLM's words, which is not synthesis.
WORK_EVENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    Stage.LLM: (Ev.REQUEST, (Ev.DONE, Ev.CANCEL)),
    Stage.TTS: (Ev.REQUEST, (Ev.CHUNK, Ev.CANCEL)),
}

#: Memory counters before this much of the series are warm-up when the trace has no reply
#: to the user to date the warm-up by (see :func:`warmup_end_ns`).
WARMUP_FALLBACK_S = 10.0


def _norm(events: Iterable[Any]) -> list[Event]:
    out = []
    for e in events:
        if isinstance(e, Event):
            out.append(e)
        elif isinstance(e, dict):
            out.append(record_to_event(e))
        else:
            out.append(Event(*e))
    return out


def _pick_last(evs, stage, name, before=None, flow=None):
    best = None
    best_flow = None
    for e in evs:
        if e.stage == stage and e.name == name and e.ph != "C":
            if before is not None and e.ts_ns > before:
                continue
            best = e
            if flow is not None and e.flow == flow:
                best_flow = e
    return best_flow or best


def _pick_first(evs, stage, name, after=None):
    for e in evs:
        if e.stage == stage and e.name == name and e.ph != "C":
            if after is None or e.ts_ns >= after:
                return e
    return None


def _milestones(evs: Sequence[Event]) -> list[Event | None]:
    """Raw milestone events of one turn (sorted by time), or None if absent."""
    endpoint = _pick_first(evs, Stage.TURN, Ev.ENDPOINT)
    speech_end = _pick_last(
        evs, Stage.TURN, Ev.USER_SPEECH_END, before=endpoint.ts_ns if endpoint else None
    ) or _pick_last(evs, Stage.TURN, Ev.USER_SPEECH_END)
    send = _pick_first(evs, Stage.TRANSPORT, Ev.SEND_AUDIO)
    flow = send.flow if send is not None else None
    if send is not None:
        tts_fc = _pick_last(evs, Stage.TTS, Ev.FIRST_CHUNK, before=send.ts_ns, flow=flow)
    else:
        tts_fc = _pick_first(evs, Stage.TTS, Ev.FIRST_CHUNK)
    if tts_fc is not None:
        llm_ft = _pick_last(evs, Stage.LLM, Ev.FIRST_TOKEN, before=tts_fc.ts_ns, flow=flow)
    elif send is not None:
        llm_ft = _pick_last(evs, Stage.LLM, Ev.FIRST_TOKEN, before=send.ts_ns, flow=flow)
    else:
        llm_ft = _pick_first(evs, Stage.LLM, Ev.FIRST_TOKEN)
    asr_final = None
    if speech_end is not None:
        asr_final = _pick_first(evs, Stage.ASR, Ev.FINAL, after=speech_end.ts_ns)
    if asr_final is None:
        asr_final = _pick_last(evs, Stage.ASR, Ev.FINAL)
    play = None
    if send is not None:
        play = _pick_first(evs, Stage.CLIENT, Ev.PLAYOUT_START, after=send.ts_ns)
    if play is None:
        play = _pick_first(evs, Stage.CLIENT, Ev.PLAYOUT_START)
    return [speech_end, endpoint, asr_final, llm_ft, tts_fc, send, play]


def _group_turns(events: Iterable[Event]) -> dict[tuple[str, int], list[Event]]:
    turns: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for e in sorted(_norm(events), key=lambda e: e.ts_ns):
        if e.turn is not None and e.ph != "C":
            turns[(e.session, e.turn)].append(e)
    return turns


def turn_table(events: Iterable[Any]) -> list[dict]:
    """One row per turn (ordered by time) with the stage columns in ms.

    Keys: ``session``, ``turn``, each key of :data:`COLUMNS` (ms rounded to 0.1, or ``None``
    when its milestone is missing), ``total_ms`` (= the sum of the non-None columns),
    ``server_ms`` (up to the first send_audio), ``mouth_to_ear_ms`` (up to client playout
    start, or None), ``missing`` (milestone names absent), ``barge_in``, ``speculative`` (a
    speculation was committed), ``t0_ns`` (first milestone present, tracer clock) and
    ``milestones_ns`` (clamped milestone times, None when absent).
    """
    rows = []
    for (sess, turn), evs in sorted(_group_turns(events).items(), key=lambda kv: kv[1][0].ts_ns):
        raw = _milestones(evs)
        # breakdown() reads 0 as "not reached" (a TurnRecord's default), but a trace clock may
        # read 0 (a Perfetto file from elsewhere starts there): give it times from just before
        # the first milestone
        origin = min((m.ts_ns for m in raw if m is not None), default=0) - 1
        times = [m.ts_ns - origin if m is not None else None for m in raw]
        marks = [t + origin if t is not None else None for t in clamped(times)]
        present = [t for t in marks if t is not None]
        if len(present) < 2:
            continue
        stages = breakdown(*times[:6], playout_start=times[6], unit_ms=1e-6)
        row: dict[str, Any] = {"session": sess, "turn": turn}
        for bkey, (key, _) in zip(_BREAKDOWN_KEYS, COLUMNS):
            row[key] = stages[bkey]
        cols = [row[k] for k, _ in COLUMNS]
        row["total_ms"] = round(sum(v for v in cols if v is not None), 1)
        row["server_ms"] = (
            round(sum(v for v in cols[:5] if v is not None), 1) if marks[5] is not None else None
        )
        row["mouth_to_ear_ms"] = (
            row["total_ms"] if marks[6] is not None and marks[0] is not None else None
        )
        row["missing"] = [
            f"{st}.{nm}" for (st, nm), t in zip(MILESTONES, marks) if t is None
        ]
        # a turn the bot started (a greeting) has no user speech to measure from: its total is
        # not a voice-to-voice figure and stays out of their percentiles
        row["from_user_speech"] = marks[0] is not None
        row["barge_in"] = any(e.stage == Stage.TURN and e.name == Ev.BARGE_IN for e in evs)
        row["speculative"] = any(
            e.stage == Stage.SPECULATION and e.name == Ev.COMMIT for e in evs
        )
        # time in tool calls: inside the stages above (the LLM waits for them), not added to them
        tools = [e for e in evs if e.stage == Stage.TOOL and e.name == Ev.TOOL_CALL and e.ph == "X"]
        row["tool_calls"] = len(tools)
        row["tools_ms"] = round(sum(e.dur_ns for e in tools) / 1e6, 1) if tools else None
        row["t0_ns"] = present[0]
        row["milestones_ns"] = marks
        rows.append(row)
    return rows


def percentiles(rows: Sequence[dict], qs: Sequence[float] = (50, 90, 99)) -> dict[str, dict]:
    """``{column key: {"p50": ms, ...}}`` over the turns where the column is present
    (numpy's linear interpolation between closest ranks); the totals only over turns that
    start at the user's speech end (not a greeting's)."""
    keys = [k for k, _ in COLUMNS] + ["total_ms", "server_ms", "mouth_to_ear_ms"]
    out: dict[str, dict] = {}
    for k in keys:
        voice = k in ("total_ms", "server_ms", "mouth_to_ear_ms")
        vals = [r[k] for r in rows
                if r.get(k) is not None and (not voice or r.get("from_user_speech", True))]
        out[k] = {f"p{q:g}": float(np.percentile(vals, q)) if vals else None for q in qs}
        out[k]["n"] = len(vals)
    return out


# ----------------------------------------------------------------- stage RTF
def _union(intervals: Iterable[tuple[int, int]]) -> int:
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _work_intervals(evs: Sequence[Event], opens: str, closes: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) of each piece of work in one turn's events (sorted by time): an ``opens``
    event to the first of ``closes`` after it.  A stage serves one piece at a time, so a new
    ``opens`` while one is open means the earlier piece ended without output (a piece of text
    with no words, which the voice skips): that one is dropped, not stretched to the next."""
    out = []
    start: int | None = None
    for e in evs:
        if e.name == opens:
            start = e.ts_ns
        elif e.name in closes and start is not None:
            out.append((start, e.ts_ns))
            start = None
    return out


def _audio_s(evs: Iterable[Event]) -> float:
    """Seconds of audio the events say they covered."""
    total = 0.0
    for e in evs:
        a = e.args or {}
        if "audio_s" in a:
            total += float(a["audio_s"])
        elif "samples" in a and ("sample_rate" in a or "sr" in a):
            total += float(a["samples"]) / float(a.get("sample_rate", a.get("sr")))
    return total


def stage_stats(events: Iterable[Any], stages: Sequence[str] = MODEL_STAGES) -> list[dict]:
    """RTF, busy fraction and verdict per model stage (rules in the module doc)."""
    evs = sorted(_norm(events), key=lambda e: e.ts_ns)
    has_gpu_counter = any(
        e.ph == "C" and e.stage == Stage.MEMORY and e.name in (Ev.GPU_MB, Ev.GPU_RESERVED_MB)
        for e in evs
    )
    out = []
    for stage in stages:
        sevs = [e for e in evs if e.stage == stage and e.ph != "C"]
        if not sevs:
            continue
        by_turn: dict[Any, list[Event]] = defaultdict(list)
        for e in sevs:
            by_turn[(e.session, e.turn)].append(e)
        spans = [e for e in sevs if e.ph == "X"]
        if spans:
            busy_iv = [(e.ts_ns, e.end_ns) for e in spans]
            basis = "spans"
        elif stage in WORK_EVENTS:
            opens, closes = WORK_EVENTS[stage]
            busy_iv = [iv for g in by_turn.values() for iv in _work_intervals(g, opens, closes)]
            basis = f"{opens}→{closes[0]}" if busy_iv else "none"
        else:
            busy_iv, basis = [], "none"
        # window: per turn first → last event (spans included)
        win_iv = []
        for (s, t), g in by_turn.items():
            if t is None:
                win_iv += [(e.ts_ns, e.end_ns) for e in g]
            else:
                win_iv.append((min(e.ts_ns for e in g), max(e.end_ns for e in g)))
        busy = _union(busy_iv)
        window = max(_union(win_iv + busy_iv), 1)
        # audio from the spans when they carry it, else from the instants (tts chunks): the
        # two may describe the same audio, which must not count twice
        audio_s = _audio_s(spans) or _audio_s(e for e in sevs if e.ph != "X")
        cpu_ns = sum(int(e.args.get("cpu_ns", 0)) for e in spans if e.args)
        has_cpu = any(e.args and "cpu_ns" in e.args for e in spans)
        gpu_busy = sum(int(e.args.get("gpu_busy_ns", 0)) for e in spans if e.args)
        on_gpu = any(
            e.args and (str(e.args.get("device", "")).startswith("cuda") or "gpu_busy_ns" in e.args)
            for e in spans
        )
        io = any(e.args and e.args.get("io") for e in spans)
        busy_frac = busy / window
        if audio_s > 0:
            rtf, rtf_basis = busy / 1e9 / audio_s, "audio"
        else:
            rtf, rtf_basis = busy_frac, "wall"
        if on_gpu:
            dev_frac = (gpu_busy / window) if gpu_busy else busy_frac
            verdict = "GPU-bound" if dev_frac >= 0.5 else "waiting"
            why = f"GPU busy {dev_frac:.0%} of window" + ("" if dev_frac >= 0.5 else " (starved)")
        elif busy_frac < 0.25:
            verdict, why = "waiting", f"busy {busy_frac:.0%} of window"
        elif io or (has_cpu and cpu_ns < 0.5 * busy):
            verdict = "I/O-bound"
            why = "io span" if io else f"CPU {cpu_ns / max(busy, 1):.0%} of busy"
        else:
            verdict = "CPU-bound"
            why = (f"CPU {cpu_ns / max(busy, 1):.0%} of busy" if has_cpu
                   else f"busy {busy_frac:.0%} of window, no GPU")
        out.append({
            "stage": stage,
            "busy_s": busy / 1e9,
            "window_s": window / 1e9,
            "busy_frac": busy_frac,
            "audio_s": audio_s or None,
            "rtf": rtf,
            "rtf_basis": rtf_basis,
            "busy_basis": basis,
            "on_gpu": on_gpu,
            "gpu_counters": has_gpu_counter,
            "verdict": verdict,
            "why": why,
        })
    return out


# -------------------------------------------------------------------- memory
def warmup_end_ns(events: Iterable[Any]) -> int | None:
    """When the process is warm: the end of its first reply to the user (the first
    ``turn.turn_end`` after the first ``asr.final``).  By then the recognizer, the LLM and the
    voice have each run once, so their weights are paged in and their buffers allocated; a
    greeting's turn end comes before any ASR and does not count.  None when the trace has no
    such reply."""
    first_final = None
    for e in sorted(_norm(events), key=lambda e: e.ts_ns):
        if e.ph == "C":
            continue
        if first_final is None and e.stage == Stage.ASR and e.name == Ev.FINAL:
            first_final = e.ts_ns
        elif first_final is not None and e.stage == Stage.TURN and e.name == Ev.TURN_END:
            return e.ts_ns
    return None


def memory_trend(events: Iterable[Any]) -> dict[str, dict]:
    """First/last/max of each memory counter, and its slope (MB/min) after warm-up.

    Warm-up ends at :func:`warmup_end_ns`, or, in a trace without a reply to the user,
    :data:`WARMUP_FALLBACK_S` after the counter's first sample.  The slope runs from the first
    sample at or after it to the last sample (``trend_s`` seconds); it is None ("n/a") with
    fewer than two samples there.  ``warmup_n`` counts the samples left out of it.
    """
    evs = _norm(events)
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for e in evs:
        if e.ph == "C" and e.stage == Stage.MEMORY:
            series[e.name].append((e.ts_ns, float(e.args.get("value", 0.0))))
    warm = warmup_end_ns(evs) if series else None
    out = {}
    for name, pts in series.items():
        pts.sort()
        start = warm if warm is not None else pts[0][0] + int(WARMUP_FALLBACK_S * 1e9)
        after = [p for p in pts if p[0] >= start]
        slope = None
        trend_s = (after[-1][0] - after[0][0]) / 1e9 if after else 0.0
        if len(after) >= 2 and trend_s > 0:
            slope = (after[-1][1] - after[0][1]) / (trend_s / 60.0)
        out[name] = {"first": pts[0][1], "last": pts[-1][1], "max": max(v for _, v in pts),
                     "slope_mb_per_min": slope, "trend_s": trend_s, "n": len(pts),
                     "warmup_n": len(pts) - len(after)}
    return out


# ------------------------------------------------------------------- output
def _fmt(v: float | None, w: int = 8) -> str:
    return f"{'—':>{w}}" if v is None else f"{v:>{w}.1f}"


def format_table(rows: Sequence[dict]) -> str:
    """The per-turn table plus p50/p90/p99 rows, as text."""
    heads = ["turn"] + [h for _, h in COLUMNS] + ["total", "server", "mouth→ear", "tools"]
    keys = [k for k, _ in COLUMNS] + ["total_ms", "server_ms", "mouth_to_ear_ms", "tools_ms"]
    widths = [max(6, len(h)) for h in heads]
    lines = ["  ".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
    lines.append("  ".join("-" * w for w in widths))
    multi = len({r["session"] for r in rows}) > 1
    for r in rows:
        label = f"{r['session']}:{r['turn']}" if multi else str(r["turn"])
        flags = (("*" if r["speculative"] else "") + ("!" if r["barge_in"] else "")
                 + ("" if r.get("from_user_speech", True) else "~"))
        cells = [f"{label + flags:>{widths[0]}}"]
        cells += [_fmt(r.get(k), w) for k, w in zip(keys, widths[1:])]
        lines.append("  ".join(cells))
    lines.append("  ".join("-" * w for w in widths))
    pc = percentiles(rows)
    for q in ("p50", "p90", "p99"):
        cells = [f"{q:>{widths[0]}}"] + [_fmt(pc[k][q] if k in pc else None, w) for k, w in zip(keys, widths[1:])]
        lines.append("  ".join(cells))
    lines.append("(ms; * speculative reply committed, ! barge-in, ~ no user speech before it (a greeting):"
                 " its total is left out of the percentiles; — milestone missing; stages sum to total;"
                 " tools: time in tool calls, inside the stages)")
    return "\n".join(lines)


def format_stages(stats: Sequence[dict], mem: dict[str, dict]) -> str:
    lines = [f"{'stage':<6} {'RTF':>7} {'basis':<6} {'busy s':>8} {'window s':>9} "
             f"{'busy%':>6}  verdict"]
    for s in stats:
        lines.append(
            f"{s['stage']:<6} {s['rtf']:>7.3f} {s['rtf_basis']:<6} {s['busy_s']:>8.3f} "
            f"{s['window_s']:>9.3f} {s['busy_frac']:>6.0%}  {s['verdict']} ({s['why']})"
        )
    for name, m in sorted(mem.items()):
        slope = m["slope_mb_per_min"]
        trend = "n/a" if slope is None else f"{slope:+.2f} MB/min over {m['trend_s']:.1f} s"
        lines.append(f"memory {name}: first {m['first']:.1f}, last {m['last']:.1f}, "
                     f"max {m['max']:.1f}, trend {trend} after warm-up "
                     f"({m['n']} samples, {m['warmup_n']} of them warm-up)")
    return "\n".join(lines)


_COLORS = ("#8e6c8a", "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f")
_TOOL_COLOR = "#edc948"


def write_waterfalls(events: Iterable[Any], out_dir: str, rows: Sequence[dict] | None = None) -> list[str]:
    """One PNG per turn: the stage segments (the table row) as a waterfall, and
    below it each stage's raw activity (spans as bars, instants as ticks).
    Returns the file paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    evs = _norm(events)
    rows = turn_table(evs) if rows is None else rows
    groups = _group_turns(evs)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for r in rows:
        t0 = r["t0_ns"]
        ms = r["milestones_ns"]
        tevs = groups.get((r["session"], r["turn"]), [])
        fig = Figure(figsize=(10, 5.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        labels: list[str] = []
        y = 0
        prev = None
        for i, t in enumerate(ms):
            if i > 0:
                key, head = COLUMNS[i - 1]
                if t is not None and prev is not None:
                    ax.barh(y, (t - prev) / 1e6, left=(prev - t0) / 1e6, color=_COLORS[i - 1],
                            height=0.6)
                    ax.text((t - t0) / 1e6, y, f" {r[key]:.0f}", va="center", fontsize=8)
                labels.append(head)
                y += 1
            if t is not None:
                prev = t
        ax.barh(y, r["total_ms"], left=0, color="#bab0ac", height=0.6)
        ax.text(r["total_ms"], y, f" {r['total_ms']:.0f} ms", va="center", fontsize=8)
        labels.append("total")
        y += 1
        stage_rows = [s for s in (Stage.VAD, Stage.ASR, Stage.LLM, Stage.TOOL, Stage.TTS, Stage.TRANSPORT,
                                   Stage.CLIENT, Stage.SPECULATION)
                      if any(e.stage == s for e in tevs)]
        for s in stage_rows:
            for e in tevs:
                if e.stage != s:
                    continue
                x = (e.ts_ns - t0) / 1e6
                if e.ph == "X":
                    ax.barh(y, max(e.dur_ns / 1e6, 0.5), left=x, color=_TOOL_COLOR if s == Stage.TOOL else "#999999",
                            height=0.5)
                    if s == Stage.TOOL:
                        ax.text(x, y, f" {e.args.get('tool', '')} {e.dur_ns / 1e6:.0f} ms", va="center", fontsize=7)
                else:
                    ax.plot([x], [y], marker="|", color="#333333", markersize=9)
            labels.append(f"[{s}]")
            y += 1
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="k", lw=0.6)
        span_ms = max(r["total_ms"], 100.0)
        ax.set_xlim(-0.6 * span_ms, 1.6 * span_ms)  # focus on the reply path
        ax.set_xlabel("ms since end of user speech")
        title = f"session {r['session']} turn {r['turn']}: total {r['total_ms']:.0f} ms"
        if r["mouth_to_ear_ms"] is not None:
            title += f" (mouth→ear {r['mouth_to_ear_ms']:.0f} ms, server {r['server_ms']:.0f} ms)"
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(r["session"]))
        p = os.path.join(out_dir, f"turn_{safe}_{int(r['turn']):04d}.png")
        fig.savefig(p)
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="duplex trace report",
        description="Per-turn latency table, percentiles, stage RTF verdicts and waterfall PNGs.",
    )
    ap.add_argument("trace", metavar="TRACE", help="trace file (.jsonl event log/spill or Perfetto .json)")
    ap.add_argument("--png-dir", metavar="DIR", help="write one waterfall PNG per turn here")
    ap.add_argument("--json", action="store_true", help="print the table and stats as JSON")
    a = ap.parse_args(argv)
    from agent.tracing.export import load_events

    try:
        events = load_events(a.trace)
    except (OSError, ValueError) as e:
        print(f"duplex trace report: cannot read {a.trace}: {e}", file=sys.stderr)
        return 2
    rows = turn_table(events)
    stats = stage_stats(events)
    mem = memory_trend(events)
    if a.json:
        doc = {
            "turns": [{k: v for k, v in r.items() if k not in ("milestones_ns",)} for r in rows],
            "percentiles": percentiles(rows),
            "stages": stats,
            "memory": mem,
        }
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(f"{a.trace}: {len(events)} events, {len(rows)} turns")
        if rows:
            print(format_table(rows))
        print()
        print(format_stages(stats, mem))
    if a.png_dir:
        paths = write_waterfalls(events, a.png_dir, rows)
        if not a.json:
            print(f"\nwrote {len(paths)} waterfall PNG(s) to {a.png_dir}")
    if not rows:
        print("no complete turns found in the trace", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
