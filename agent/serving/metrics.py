"""What `/metrics` shows of a serving process, in Prometheus text exposition: conversations live
and ended (served, refused, failed), each finished turn's voice-to-voice time and stage breakdown
(agent.tracing.stages), the in-process recognizer engine's free slots or a remote pool's failovers
and gaps, event-loop lag, the load that admission reads (CPU, the LLM's queue) and the process
(memory, CPU time). One registry per server (not prometheus-client's global one), so servers and tests do not share counts."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from agent.tracing.stages import STAGE_KEYS
from transport.base import PassThrough, Transport
from transport.events import SessionError, SessionEvent, TurnLatency

log = logging.getLogger("duplex.metrics")

RESULTS = ("served", "refused", "failed")
# voice-to-voice is good under ~1 s and bad past 2 s (issue 17's target); stages are smaller
V2V_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
STAGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class ServerMetrics:
    """`engine`: the in-process recognizer (asr.engine.recognizer.EngineRecognizer), if one is used."""

    def __init__(self, engine=None):
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.active = Gauge("duplex_sessions_active", "Conversations live now", registry=r)
        self.total = Counter("duplex_sessions", "Conversations by how they ended (refused: never started)",
                             ["result"], registry=r)
        for result in RESULTS:
            self.total.labels(result)  # shown at 0 before the first one
        self.voice_to_voice = Histogram("duplex_voice_to_voice_seconds",
                                        "User's end of speech to the reply's first audio, per turn",
                                        buckets=V2V_BUCKETS, registry=r)
        self.stage = Histogram("duplex_stage_seconds", "Per-turn stage latency (agent.tracing.stages keys, without _ms)",
                               ["stage"], buckets=STAGE_BUCKETS, registry=r)
        self.loop_lag = Histogram("duplex_event_loop_lag_seconds",
                                  "How late the event loop woke a sleeper (the whole server waits this long)",
                                  buckets=LAG_BUCKETS, registry=r)
        if engine is not None:
            Gauge("duplex_recognizer_slots_free", "Free slots of the in-process recognizer engine",
                  registry=r).set_function(lambda: engine.slots - len(engine.scheduler.sessions))

    def show_load(self, monitor) -> None:
        """The measured load that admission reads (agent.serving.load.LoadMonitor)."""
        Gauge("duplex_cpu_utilisation", "The machine's CPU use, averaged as admission reads it (0-1)",
              registry=self.registry).set_function(lambda: monitor.cpu)
        Gauge("duplex_llm_queue_depth", "Replies waiting for the LLM's first token",
              registry=self.registry).set_function(monitor.llm_queue)

    def show_recognizer_pool(self, recognizer) -> None:
        """A remote recognizer pool's failovers (asr.remote.RemoteRecognizer.stats), for a
        recognizer that keeps them: words said during a gap are lost, so they are counted."""
        from asr.remote import PoolStats

        if isinstance(stats := getattr(recognizer, "stats", None), PoolStats):
            self.registry.register(PoolCollector(stats))

    def refused(self, reason: str) -> None:
        """transport.admission's on_refused."""
        self.total.labels("refused").inc()

    def observe_turn(self, summary: dict) -> None:
        """One finished turn's `TurnRecord.summary()` (ms; None where a milestone was not reached)."""
        if (v2v := summary.get("voice_to_voice_ms")) is not None:
            self.voice_to_voice.observe(v2v / 1000.0)
        for key in STAGE_KEYS:
            if (ms := summary.get(key)) is not None:
                self.stage.labels(key.removesuffix("_ms")).observe(ms / 1000.0)

    def exposition(self) -> tuple[int, dict[str, str], bytes]:
        """The `/metrics` answer (transport.web.server's HttpRoute)."""
        return 200, {"Content-Type": CONTENT_TYPE_LATEST}, generate_latest(self.registry)

    @contextlib.asynccontextmanager
    async def conversation(self, session_id: str, transport: Transport) -> AsyncIterator[Transport]:
        """Count one conversation while it runs; yields the transport to give its Session (the
        same one, watched for finished turns). One that ends abnormally is logged with its id."""
        watched = WatchedTransport(transport, self)
        self.active.inc()
        reason: str | None = "cancelled (the server stopped)"
        try:
            yield watched
            end = getattr(transport, "abnormal_end", None)  # transports that can tell a lost peer
            reason = watched.fatal or (end() if end is not None else None)
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.active.dec()
            self.total.labels("failed" if reason else "served").inc()
            if reason:
                log.warning("%s ended abnormally: %s", session_id, reason)

class PoolCollector(Collector):
    """asr.remote.PoolStats as counters, read at each scrape (the recognizer counts; we show)."""

    def __init__(self, stats):
        self.stats = stats

    def collect(self):
        s = self.stats
        yield CounterMetricFamily("duplex_recognizer_failovers",
                                  "Recognizer streams moved to another replica after theirs was lost mid-call",
                                  value=s.reconnects)
        yield CounterMetricFamily("duplex_recognizer_gaps", "Gaps in a conversation's transcript left by failovers",
                                  value=s.gaps)
        yield CounterMetricFamily("duplex_recognizer_gap_seconds",
                                  "Caller audio no recognizer transcribed in those gaps (its words are lost)",
                                  value=s.gap_seconds)
        yield CounterMetricFamily("duplex_recognizer_refusals",
                                  "Replica tries that were refused or went unanswered (full, draining, down)",
                                  value=s.refusals)


class WatchedTransport(PassThrough):
    """A conversation's transport, passed through, noting the events that metrics need: each
    finished turn's latency, and an error that ended the conversation."""

    def __init__(self, inner: Transport, metrics: ServerMetrics):
        super().__init__(inner)
        self.metrics = metrics
        self.fatal: str | None = None

    async def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, TurnLatency):
            self.metrics.observe_turn(event.summary)
        elif isinstance(event, SessionError) and event.fatal:
            self.fatal = f"{event.code}: {event.message}"
        await self.inner.send_event(event)
