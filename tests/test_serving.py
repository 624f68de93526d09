"""Serving over real loopback sockets, wired as `duplex serve` wires it (agent.metrics,
transport.admission, transport.web.access), with the test doubles for models: /healthz,
/readyz with the --max-sessions cap, /metrics read with prometheus-client's own parser after a
real conversation, a lost connection logged as failed, --auth-token and the Origin check."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agent.config import Models
from agent.metrics import ServerMetrics
from agent.session import Session, SessionConfig
from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice, burst
from helpers import await_until, free_port, page_conversation
from transport.admission import Admission
from transport.telephony.media_streams import DIALECTS, MediaStreamCall
from transport.telephony.media_streams_ws import MediaStreamTransport
from transport.web.access import BrowserAccess
from transport.web.server import run_server

RATE = 16000
FRAME = 320  # 20 ms, as the page sends


@dataclass
class Served:
    port: int
    admission: Admission
    metrics: ServerMetrics

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"


@contextlib.asynccontextmanager
async def serving(max_sessions: int = 16, token: str | None = None, origins: list[str] | None = None):
    """A server as cmd_serve builds one: one admission and one metrics object, each conversation
    a Session on the watched transport, /metrics among the HTTP routes, the lag sampler on."""
    models = Models(asr=ScriptedRecognizer(["what time is it"] * 8), llm=ScriptedLLM("It is noon."),
                    tts=ToneVoice(), vad_factory=EnergyVAD)
    cfg = SessionConfig(speculate=False)
    cfg.turns.use_eou = False
    metrics = ServerMetrics()
    admission = Admission(max_sessions, on_refused=metrics.refused)
    ids = itertools.count()

    async def handler(transport):
        sid = f"web{next(ids)}"
        async with metrics.conversation(sid, transport) as watched:
            await Session(models, watched, cfg, session_id=sid).run()

    port, ready = free_port(), asyncio.Event()
    phone = {"/twilio": lambda ws: MediaStreamTransport(ws, MediaStreamCall(DIALECTS["twilio"]))}
    tasks = [asyncio.create_task(run_server(handler, "127.0.0.1", port, 16000, ready, admission=admission,
                                            routes=phone, http_routes={"/metrics": metrics.exposition},
                                            access=BrowserAccess.of(token, origins))),
             asyncio.create_task(metrics.sample_loop_lag(period_s=0.02))]
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield Served(port, admission, metrics)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def get(port: int, path: str) -> tuple[int, dict, str]:
    """An HTTP GET on loopback (urllib, off the loop): status, headers, body."""
    def fetch():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()
    return await asyncio.to_thread(fetch)


async def refused_status(url: str, **kw) -> int | None:
    """The HTTP status a WebSocket upgrade is refused with, or None when it opens."""
    try:
        async with connect(url, **kw) as ws:
            await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))
            for _ in range(20):  # the session's state event may come before the ready
                if json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "ready":
                    return None
            raise AssertionError("no ready event")
    except InvalidStatus as e:
        return e.response.status_code


async def metric_samples(port: int) -> dict[tuple[str, tuple], float]:
    """/metrics through prometheus-client's parser: {(sample name, sorted labels): value}."""
    status, headers, text = await get(port, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def question() -> np.ndarray:
    return np.concatenate([np.zeros(int(0.3 * RATE), np.float32), burst(1.0, seed=1),
                           np.zeros(int(1.2 * RATE), np.float32)])


async def talk(url: str, audio: np.ndarray) -> list[dict]:
    log = await page_conversation(url, audio, RATE)
    assert any(e["type"] in ("bot_done", "error") for e in log)
    return log


async def test_healthz_and_readyz_follow_the_session_cap():
    async with serving(max_sessions=2) as s:
        assert (await get(s.port, "/healthz"))[0] == 200
        assert (await get(s.port, "/readyz"))[:3:2] == (200, "ready\n")
        async with connect(s.url("/ws")), connect(s.url("/ws")) as second:
            assert await await_until(lambda: s.admission.live == 2, timeout=10)
            status, _, body = await get(s.port, "/readyz")
            assert status == 503 and "full: 2 of 2" in body
            assert await refused_status(s.url("/ws")) == 503  # before the WebSocket opens
            assert (await get(s.port, "/healthz"))[0] == 200  # full is not unhealthy
            await second.close()
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            assert (await get(s.port, "/readyz"))[0] == 200
            assert await refused_status(s.url("/ws")) is None  # the freed place is taken again
        samples = await metric_samples(s.port)
        assert samples[("duplex_sessions_total", (("result", "refused"),))] == 1


async def test_metrics_show_a_finished_conversation():
    async with serving() as s:
        before = await metric_samples(s.port)
        assert before[("duplex_sessions_total", (("result", "served"),))] == 0  # shown before the first
        log = await talk(s.url("/ws"), question())
        assert [e for e in log if e["type"] == "bot_done"] and not [e for e in log if e["type"] == "error"]
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
        samples = await metric_samples(s.port)
    assert samples[("duplex_sessions_active", ())] == 0
    assert samples[("duplex_sessions_total", (("result", "served"),))] == 1
    assert samples[("duplex_sessions_total", (("result", "failed"),))] == 0
    (latency,) = [e for e in log if e["type"] == "latency"]
    assert samples[("duplex_voice_to_voice_seconds_count", ())] == 1
    assert samples[("duplex_voice_to_voice_seconds_sum", ())] == pytest.approx(
        latency["voice_to_voice_ms"] / 1000, abs=1e-3)
    for stage in ("endpoint", "asr_final", "llm_ttft", "tts_first_chunk", "send"):
        assert samples[("duplex_stage_seconds_count", (("stage", stage),))] == 1, stage
    assert samples[("duplex_event_loop_lag_seconds_count", ())] >= 1


async def test_a_lost_connection_is_counted_failed_and_logged_with_its_id(caplog):
    caplog.set_level(logging.WARNING, logger="duplex.metrics")
    async with serving() as s:
        ws = await connect(s.url("/ws"))
        await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))
        await ws.recv()  # the conversation is on
        ws.transport.abort()  # gone without a close frame, as a dropped network or a killed tab
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
        samples = await metric_samples(s.port)
    assert samples[("duplex_sessions_total", (("result", "failed"),))] == 1
    (record,) = [r for r in caplog.records if r.name == "duplex.metrics"]
    assert "web0 ended abnormally" in record.getMessage() and "no close frame" in record.getMessage()


async def test_a_token_is_required_when_set():
    async with serving(token="s3cret") as s:
        assert await refused_status(s.url("/ws")) == 401
        assert await refused_status(s.url("/ws?token=wrong")) == 401
        assert await refused_status(s.url("/ws"), additional_headers={"Authorization": "Bearer wrong"}) == 401
        assert await refused_status(s.url("/ws?token=s3cret")) is None
        assert await refused_status(s.url("/ws"), additional_headers={"Authorization": "Bearer s3cret"}) is None
        assert (await get(s.port, "/healthz"))[0] == 200  # probes need no token
        async with connect(s.url("/twilio")):  # phone routes: their carriers' signatures are checked elsewhere
            pass


async def test_a_foreign_origin_is_refused():
    async with serving() as s:
        own = f"http://127.0.0.1:{s.port}"
        assert await refused_status(s.url("/ws"), origin="http://evil.example") == 403
        assert await refused_status(s.url("/ws"), origin="null") == 403  # a sandboxed frame or a file
        for origin in (own, "http://localhost:5173", "https://127.0.0.1"):
            assert await refused_status(s.url("/ws"), origin=origin) is None, origin
        assert await refused_status(s.url("/ws")) is None  # no Origin: not a browser
    async with serving(origins=["https://app.example"]) as s:
        assert await refused_status(s.url("/ws"), origin="https://app.example") is None
        assert await refused_status(s.url("/ws"), origin="http://localhost:5173") == 403  # the list replaces localhost
        assert await refused_status(s.url("/ws"), origin=f"http://127.0.0.1:{s.port}") is None  # its own page


async def test_free_recognizer_slots_follow_the_in_process_engine():
    from agent.cli import _engine_of
    from asr.engine_recognizer import EngineRecognizer

    engine = EngineRecognizer.load(slots=2)  # tiny random weights: the slots, not the words, matter
    assert _engine_of(ScriptedRecognizer([])) is None
    metrics = ServerMetrics(engine=_engine_of(engine))

    def free() -> float:
        (value,) = [s.value for f in text_string_to_metric_families(metrics.exposition()[2].decode())
                    for s in f.samples if s.name == "duplex_recognizer_slots_free"]
        return value

    try:
        assert free() == 2
        stream = await engine.open_stream()
        assert free() == 1
        await stream.close()
        assert await await_until(lambda: free() == 2, timeout=10)
    finally:
        await engine.aclose()
