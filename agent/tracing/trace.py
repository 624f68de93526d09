"""Low-overhead latency tracer for duplex sessions.

One :class:`Tracer` per session records instant events, spans and counters
into a bounded in-memory ring.  Every timestamp comes from one monotonic clock
(:func:`time.perf_counter_ns`), so events from every stage of the pipeline can
be subtracted from one another directly.

Stages (each becomes one track in the Perfetto export) and the events the
session records on them (instants unless noted; ``turn=`` is set on all of
them):

``audio_in``
    ``frame`` (sampled, not every frame).
``vad``
    ``speech`` / ``silence`` transitions.
``turn``
    ``user_speech_start``, ``user_speech_end`` (``ts_ns`` may be given
    explicitly, e.g. the exact end taken from an input file), ``endpoint``
    (end of turn decided), ``barge_in``, ``turn_end``, ``call_end`` (the agent ended the call).
``asr``
    ``partial`` (``text=``), ``final`` (``text=``); recognizer steps may be
    spans (``audio_s=`` seconds of audio they covered).
``llm``
    ``request``, ``first_token``, ``token`` (``text=``), ``cancel``, ``done``,
    ``yielded`` (a paused reply gave the model back); the generation itself may
    be a span.
``tts``
    ``request`` (``text=``: a piece of text handed to the voice), ``first_chunk``,
    ``chunk`` (``samples=``, ``text=``, optionally ``sample_rate=``: the audio
    of that piece), ``cancel``, ``done``; a voice may also record each
    synthesis call as a ``synth`` span.  Between a chunk and the next request
    the voice waits for the LLM's next words, so the report counts only
    request → chunk (or the spans) as its busy time.
``transport``
    ``send_audio`` (the first one of a turn marks the start of playout on the
    server side), ``clear``.
``client``
    ``playout_start``, ``playout_end``: page-clock timestamps already
    converted to the server clock (see :meth:`Tracer.clock_offset`) and passed
    as ``ts_ns``.
``speculation``
    ``start``, ``commit``, ``cancel``.
``memory``
    counters ``rss_mb``, ``gpu_mb``, ``gpu_reserved_mb`` (see
    :mod:`agent.tracing.profiling`).
``tool``
    span ``tool_call`` (``tool``, ``arguments``; at its end ``status``,
    ``result``); ``filler``, ``tool_refused`` (``why``), ``tool_reused``.

The names are constants: :class:`Stage` for the stages, :class:`Ev` for the
event names; writers and readers (``agent.tracing.report``,
``agent.tracing.export``) use them instead of string literals.

``flow=`` (an int) links events causally across stages, e.g. a partial → LLM
request → TTS request → playout; the Perfetto exporter draws these as arrows.

Optional span/event arguments understood by the report (``agent.tracing.report``):
``audio_s`` (seconds of audio a span covered), ``samples`` + ``sample_rate``,
``device`` (``"cuda"``/``"cpu"``), ``cpu_ns`` (thread CPU time spent inside the
span), ``gpu_busy_ns`` (device time inside the span), ``io=True`` (the span
waits on a socket/HTTP peer), ``model`` (model name), ``tokens``.

Cost: recording an event appends one tuple to a preallocated ring; a disabled
tracer returns after one attribute test.  ``scripts/bench_tracer.py`` measures
it.  Spill (``spill_path=``) writes the oldest half of the ring to a JSON-lines
file when the ring fills, instead of dropping it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
import time
from typing import Any, Iterator, NamedTuple

__all__ = [
    "STAGES",
    "Stage",
    "Ev",
    "Event",
    "Tracer",
    "NullTracer",
    "event_to_record",
    "record_to_event",
    "iter_jsonl",
    "spill_header",
]

class Stage:
    """Stage (track) names: the tracer's writers and its readers (report, export) use these."""

    AUDIO_IN = "audio_in"
    VAD = "vad"
    TURN = "turn"
    ASR = "asr"
    LLM = "llm"
    TTS = "tts"
    TRANSPORT = "transport"
    CLIENT = "client"
    SPECULATION = "speculation"
    MEMORY = "memory"
    TOOL = "tool"


#: Canonical stage names, in track order.
STAGES: tuple[str, ...] = (
    Stage.AUDIO_IN,
    Stage.VAD,
    Stage.TURN,
    Stage.ASR,
    Stage.LLM,
    Stage.TTS,
    Stage.TRANSPORT,
    Stage.CLIENT,
    Stage.SPECULATION,
    Stage.MEMORY,
    Stage.TOOL,
)


CUT_BY_WORDS = "barge-in"  # Ev.INTERRUPTED's why when the user's words over the bot cut it


class Ev:
    """Event names, per stage (see the module docstring for what each carries)."""

    # audio_in
    FRAME = "frame"
    # vad
    SPEECH = "speech"
    SILENCE = "silence"
    # turn
    USER_SPEECH_START = "user_speech_start"
    USER_SPEECH_END = "user_speech_end"
    ENDPOINT = "endpoint"
    PAUSE = "pause"
    SPEECH_RESUMED = "speech_resumed"
    BARGE_IN = "barge_in"
    # the reply's audio stopped and the far end was told to drop its buffer (speech_to_clear_ms:
    # from the first frame of the user's speech over the bot)
    REPLY_PAUSED = "reply_paused"
    ECHO = "echo"  # words over the bot that were its own, heard back (text: what was heard)
    TURNED_AWAY = "turned_away"  # speech over the bot judged by its sound (level_db, fall: against the user's; away)
    INTERRUPTED = "interrupted"  # why: CUT_BY_WORDS, or why the session ended
    RESUME = "resume"
    GREETING = "greeting"
    CALL_END = "call_end"  # the agent ended the call (its goodbye was heard)
    REPLY_ERROR = "reply_error"
    TURN_END = "turn_end"
    EOU_CHECK = "eou_check"
    TEXT_TURN_CHECK = "text_turn_check"  # the chat model's end-of-message probability ("combined")
    TEXT_TURN_WARM = "text_turn_warm"  # ... its model reading a partial ahead of the check
    # asr
    PARTIAL = "partial"
    FINAL = "final"
    PARTIAL_DECODE = "partial_decode"
    PAUSE_DECODE = "pause_decode"
    OVERLAP_LOOK = "overlap_look"  # a quick decode of the words said so far over the bot
    FINAL_DECODE = "final_decode"
    STEP = "step"
    GAP = "gap"
    # tool
    TOOL_CALL = "tool_call"  # span: one tool run (name, arguments; at its end status, result)
    FILLER = "filler"  # a filler phrase said while a tool runs (text)
    TOOL_REFUSED = "tool_refused"  # a call past the reply's step limit, not run
    TOOL_REUSED = "tool_reused"  # a call the reply had made already: its result is given again
    # llm
    REQUEST = "request"
    FIRST_TOKEN = "first_token"
    TOKEN = "token"
    GENERATE = "generate"
    WARM_CACHE = "warm_cache"
    YIELDED = "yielded"  # a paused reply closed its stream, giving the model to others (tokens so far)
    CANCEL = "cancel"
    DONE = "done"
    # tts
    FIRST_CHUNK = "first_chunk"
    CHUNK = "chunk"
    SYNTH = "synth"
    # transport
    SEND_AUDIO = "send_audio"
    CLEAR = "clear"
    # client
    PLAYOUT_START = "playout_start"
    PLAYOUT_END = "playout_end"
    MOUTH_TO_EAR = "mouth_to_ear"
    CLOCK_SYNC = "clock_sync"
    # speculation
    START = "start"
    COMMIT = "commit"
    # memory (counters)
    RSS_MB = "rss_mb"
    GPU_MB = "gpu_mb"
    GPU_RESERVED_MB = "gpu_reserved_mb"


# Phases, Chrome-trace style.
PH_INSTANT = "i"
PH_SPAN = "X"  # complete span: ts_ns + dur_ns
PH_COUNTER = "C"

_MAX_OPEN_SPANS = 4096  # spans begun but never ended are forgotten beyond this

#: Compact JSON encoder (non-JSON argument values become strings).
_ENC = json.JSONEncoder(separators=(",", ":"), default=str)

JSONL_FORMAT = "duplex-trace-jsonl/1"


def spill_header(tracer: "Tracer") -> dict:
    """First line of a JSONL trace file (spill or event log)."""
    return {
        "meta": {
            "format": JSONL_FORMAT,
            "session": tracer.session_id,
            "wall_offset_ns": tracer.wall_offset_ns,
            "client_offset_ns": tracer._client_offset_ns,
        }
    }


def iter_jsonl(path: str) -> Iterator[Event]:
    """Read a JSONL trace file: header lines ``{"meta": ...}``, record lines
    (dicts, see :func:`event_to_record`) and spill batches (a JSON array of
    compact ``[ph, ts_ns, stage, name, turn, flow, args, dur_ns, id]`` arrays,
    belonging to the session named by the last header)."""
    session = ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if isinstance(obj, list):
                for t in obj:
                    ph, ts, st, nm, tu, fl, a, dur, sid = t
                    yield Event(ph, ts, st, nm, tu, fl, a or {}, dur, sid, session)
            elif "meta" in obj:
                session = obj["meta"].get("session", session)
            elif "ph" in obj:
                yield record_to_event(obj)


class Event(NamedTuple):
    """One recorded event, as returned by :meth:`Tracer.events`."""

    ph: str  # "i" instant, "X" span, "C" counter
    ts_ns: int  # tracer clock (perf_counter_ns); span start for "X"
    stage: str
    name: str
    turn: int | None = None
    flow: int | None = None
    args: dict = {}
    dur_ns: int = 0  # spans only
    id: int = 0  # span id (spans only)
    session: str = ""

    @property
    def end_ns(self) -> int:
        return self.ts_ns + self.dur_ns


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    try:  # numpy scalars and friends
        return v.item()
    except Exception:
        return str(v)


def event_to_record(ev: Event | tuple, session: str | None = None) -> dict:
    """An event (or raw ring tuple) as a JSON-serialisable dict (the JSONL format)."""
    ph, ts, stage, name, turn, flow, args, dur, sid = ev[:9]
    rec: dict[str, Any] = {
        "session": session if session is not None else (ev[9] if len(ev) > 9 else ""),
        "ph": ph,
        "ts_ns": ts,
        "stage": stage,
        "name": name,
    }
    if turn is not None:
        rec["turn"] = turn
    if flow is not None:
        rec["flow"] = flow
    if ph == PH_SPAN:
        rec["dur_ns"] = dur
        rec["id"] = sid
    if args:
        rec["args"] = _jsonable(args)
    return rec


def record_to_event(rec: dict) -> Event:
    return Event(
        ph=rec.get("ph", PH_INSTANT),
        ts_ns=int(rec["ts_ns"]),
        stage=rec.get("stage", ""),
        name=rec.get("name", ""),
        turn=rec.get("turn"),
        flow=rec.get("flow"),
        args=rec.get("args") or {},
        dur_ns=int(rec.get("dur_ns", 0)),
        id=int(rec.get("id", 0)),
        session=rec.get("session", ""),
    )


class Tracer:
    """Per-session event recorder with a bounded ring and optional spill.

    Thread-safety: recording is one ``deque.append`` (atomic under the GIL),
    so worker threads may record concurrently without losing events; spill
    takes a lock.  The ``total``/``dropped`` statistics are not locked and may
    undercount under heavy concurrent recording.
    """

    def __init__(
        self,
        session_id: str,
        capacity: int = 1 << 16,
        spill_path: str | None = None,
    ) -> None:
        if capacity < 2:
            raise ValueError("capacity must be >= 2")
        self.session_id = session_id
        self.capacity = int(capacity)
        self.spill_path = spill_path
        self.enabled = True
        # Same clock for every event; instance attribute = no Python frame.
        self.now_ns = time.perf_counter_ns
        #: wall-clock ns (time.time_ns) minus tracer clock ns, for exporters
        #: that need absolute time (OTLP).
        self.wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        # The ring: deque.append/popleft are atomic under the GIL, so threads
        # may record concurrently.  Without spill, maxlen drops the oldest;
        # with spill, the oldest half is written out when it exceeds capacity.
        self._dq: deque = deque(maxlen=None if spill_path else self.capacity)
        self._spill_at = self.capacity if spill_path else 1 << 62
        self._n = 0  # events recorded (statistics only)
        self._spilled = 0  # events written to the spill file
        self._ids = itertools.count(1)
        self._open: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._spill_file = None
        self._client_offset_ns: int | None = None
        self._client_rtt_ns: int | None = None
        self._clock_samples: list[tuple[int, int]] = []  # (rtt, offset)

    # ------------------------------------------------------------------ core
    def now_ns(self) -> int:  # pragma: no cover - replaced per instance
        return time.perf_counter_ns()

    def _append(self, ev: tuple) -> None:
        dq = self._dq
        dq.append(ev)
        self._n += 1
        if len(dq) > self._spill_at:
            self._spill()

    def _spill(self) -> None:
        """Write the oldest half of the ring to the spill file, in one batch
        (amortised cost): one JSONL line holding a JSON array of compact
        event arrays."""
        with self._lock:
            dq = self._dq
            cap = self.capacity
            if len(dq) <= cap:
                return
            if self._spill_file is None:
                self._spill_file = open(self.spill_path, "a", encoding="utf-8")
                self._spill_file.write(_ENC.encode(spill_header(self)) + "\n")
            k = cap // 2
            pop = dq.popleft
            while len(dq) > cap:
                batch = [pop() for _ in range(k)]
                self._spill_file.write(_ENC.encode(batch) + "\n")
                self._spilled += k

    def instant(
        self,
        stage: str,
        name: str,
        turn: int | None = None,
        ts_ns: int | None = None,
        flow: int | None = None,
        **args: Any,
    ) -> None:
        if not self.enabled:
            return
        dq = self._dq
        dq.append(("i", ts_ns if ts_ns is not None else self.now_ns(), stage, name, turn, flow,
                   args, 0, 0))
        self._n += 1
        if len(dq) > self._spill_at:
            self._spill()

    def begin(
        self,
        stage: str,
        name: str,
        turn: int | None = None,
        flow: int | None = None,
        **args: Any,
    ) -> int:
        """Open a span; returns its id (0 when disabled). Close it with :meth:`end`."""
        if not self.enabled:
            return 0
        sid = next(self._ids)
        op = self._open
        op[sid] = (self.now_ns(), stage, name, turn, flow, args)
        if len(op) > _MAX_OPEN_SPANS:  # forget the oldest never-ended span
            del op[next(iter(op))]
        return sid

    def end(self, span_id: int, **args: Any) -> None:
        """Close a span; extra ``args`` are merged into the begin args."""
        if not span_id:
            return
        t1 = self.now_ns()
        rec = self._open.pop(span_id, None)
        if rec is None:
            return
        t0, stage, name, turn, flow, a = rec
        if args:
            a = {**a, **args} if a else args
        dq = self._dq
        dq.append(("X", t0, stage, name, turn, flow, a, t1 - t0, span_id))
        self._n += 1
        if len(dq) > self._spill_at:
            self._spill()

    def span(
        self,
        stage: str,
        name: str,
        turn: int | None = None,
        flow: int | None = None,
        **args: Any,
    ) -> "_Span":
        """``with tracer.span("asr", "step", turn=3) as sid: ...``

        The ``as`` value is the span id.  If the body raises, the span is
        closed with ``error=<exception type>``.
        """
        if not self.enabled:
            return _NULL_SPAN
        return _Span(self, self.begin(stage, name, turn, flow, **args))

    def complete(
        self,
        stage: str,
        name: str,
        ts_ns: int,
        dur_ns: int,
        turn: int | None = None,
        flow: int | None = None,
        **args: Any,
    ) -> None:
        """Record an already-measured span (e.g. timed in a worker)."""
        if not self.enabled:
            return
        self._append(("X", ts_ns, stage, name, turn, flow, args, dur_ns, next(self._ids)))

    def counter(
        self, name: str, value: float, ts_ns: int | None = None, stage: str = "memory"
    ) -> None:
        if not self.enabled:
            return
        dq = self._dq
        dq.append(("C", ts_ns if ts_ns is not None else self.now_ns(), stage, name, None, None,
                   {"value": value}, 0, 0))
        self._n += 1
        if len(dq) > self._spill_at:
            self._spill()

    # -------------------------------------------------------------- queries
    def __len__(self) -> int:
        """Events currently held in the ring."""
        return len(self._dq)

    @property
    def total(self) -> int:
        """Events recorded since creation (ring + spilled + dropped)."""
        return self._n

    @property
    def spilled(self) -> int:
        return self._spilled

    @property
    def dropped(self) -> int:
        return max(0, self._n - self._spilled - len(self._dq))

    def _ring_tuples(self) -> list:
        with self._lock:
            for _ in range(100):
                try:
                    return list(self._dq)  # one C call: atomic under the GIL
                except RuntimeError:  # pragma: no cover - mutated mid-copy
                    continue
            return list(tuple(self._dq))  # pragma: no cover

    def events(self, include_spilled: bool = False) -> list[Event]:
        """Snapshot of the ring, oldest first (recording order).

        With ``include_spilled=True`` the spilled events are read back from the
        spill file and put in front.
        """
        sess = self.session_id
        out: list[Event] = []
        if include_spilled and self.spill_path and self._spilled:
            self.flush()
            out.extend(e for e in iter_jsonl(self.spill_path) if e.session == sess)
        out.extend(Event(*t, session=sess) for t in self._ring_tuples())
        return out

    def open_spans(self) -> list[Event]:
        """Spans begun but not yet ended (``dur_ns`` = time so far)."""
        now = self.now_ns()
        return [
            Event("X", t0, st, nm, tu, fl, a, now - t0, sid, self.session_id)
            for sid, (t0, st, nm, tu, fl, a) in list(self._open.items())
        ]

    def clear(self) -> None:
        with self._lock:
            self._dq.clear()
            self._n = 0
            self._open.clear()

    def flush(self) -> None:
        if self._spill_file is not None:
            self._spill_file.flush()

    def close(self) -> None:
        if self._spill_file is not None:
            self._spill_file.close()
            self._spill_file = None

    def __enter__(self) -> "Tracer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ clock sync
    def clock_offset(
        self,
        server_send_ns: int | None = None,
        client_ns: int | None = None,
        server_recv_ns: int | None = None,
        *,
        offset_ns: int | None = None,
    ) -> int | None:
        """Client-clock → server-clock offset (ns), from ping/pong samples.

        Call with one ping/pong exchange: the server sent the ping at
        ``server_send_ns`` (tracer clock), the page stamped it with its own
        clock ``client_ns`` (converted to ns), and the pong came back at
        ``server_recv_ns``.  Assuming a symmetric path, the client's stamp
        corresponds to the server time ``(send + recv) / 2``; the sample with
        the smallest round trip wins (NTP's rule).  ``offset_ns=`` sets the
        offset directly.  With no arguments it just returns the current
        estimate (``None`` if unknown).

        ``server_ts = client_ts + offset``; see :meth:`client_to_server_ns`.
        """
        if offset_ns is not None:
            self._client_offset_ns = int(offset_ns)
            return self._client_offset_ns
        if server_send_ns is None or client_ns is None or server_recv_ns is None:
            return self._client_offset_ns
        rtt = int(server_recv_ns) - int(server_send_ns)
        if rtt < 0:
            raise ValueError("pong received before ping was sent")
        off = (int(server_send_ns) + int(server_recv_ns)) // 2 - int(client_ns)
        self._clock_samples.append((rtt, off))
        if len(self._clock_samples) > 64:
            del self._clock_samples[0]
        best_rtt, best_off = min(self._clock_samples)
        self._client_offset_ns = best_off
        self._client_rtt_ns = best_rtt
        if self.enabled:
            self.instant("client", "clock_sync", rtt_ns=rtt, offset_ns=off, best_offset_ns=best_off)
        return best_off

    @property
    def clock_rtt_ns(self) -> int | None:
        """Round trip of the ping/pong sample the offset comes from."""
        return self._client_rtt_ns

    def client_to_server_ns(self, client_ns: int) -> int:
        """Convert a page-clock timestamp (ns) to the tracer clock."""
        if self._client_offset_ns is None:
            raise RuntimeError("no clock offset yet: call clock_offset() with a ping/pong sample")
        return int(client_ns) + self._client_offset_ns


class _Span:
    __slots__ = ("tracer", "sid")

    def __init__(self, tracer: Tracer, sid: int) -> None:
        self.tracer = tracer
        self.sid = sid

    def __enter__(self) -> int:
        return self.sid

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        if et is None:
            self.tracer.end(self.sid)
        else:
            self.tracer.end(self.sid, error=et.__name__)


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> int:
        return 0

    def __exit__(self, *exc: Any) -> None:
        return None


_NULL_SPAN = _NullSpan()


class NullTracer(Tracer):
    """A tracer that is always disabled (for code paths with no session)."""

    def __init__(self, session_id: str = "null") -> None:
        super().__init__(session_id, capacity=2)
        self.enabled = False
