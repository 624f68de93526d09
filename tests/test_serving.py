"""Serving over real loopback sockets, wired as `duplex serve` wires it (agent.serving.metrics,
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
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from agent.conversation.endpointing import SilencePolicy
from agent.conversation.config import Models
from agent.serving.load import LoadMonitor, LoadPolicy
from agent.serving.metrics import ServerMetrics
from agent.serving.server import ServeConfig, Server
from agent.conversation.session import SessionConfig
from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice, burst
from helpers import await_until, free_port, page_conversation, self_signed_cert
from media_stream_peers import peer
from transport.admission import Admission

pytestmark = pytest.mark.usefixtures("virtual_clock")

RATE = 16000
FRAME = 320  # 20 ms, as the page sends


@dataclass
class Served:
    port: int
    server: Server
    task: asyncio.Task  # Server.run

    @property
    def admission(self) -> Admission:
        return self.server.admission

    @property
    def metrics(self) -> ServerMetrics:
        return self.server.metrics

    def url(self, path: str, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


def doubles(reply: str = "It is noon.") -> Models:
    return Models(asr=ScriptedRecognizer(["what time is it"] * 64), llm=ScriptedLLM(reply),
                  tts=ToneVoice(), vad_factory=EnergyVAD)


@contextlib.asynccontextmanager
async def serving(max_sessions: int = 16, token: str | None = None, origins: list[str] | None = None,
                  monitor: LoadMonitor | None = None, models: Models | None = None,
                  session: dict | None = None, **config):
    """`duplex serve`'s own Server (agent.serving.server) on the test doubles for models (or `models`),
    `session` overriding SessionConfig fields. The measured load is off unless a test gives a
    monitor: the test machine's CPU is not the server's."""
    cfg = SessionConfig(speculate=False, **(session or {}))
    cfg.turns.endpointing = SilencePolicy()
    port = free_port()
    serve_config = ServeConfig(port=port, max_sessions=max_sessions, auth_token=token,
                               allowed_origins=origins or [], load=LoadPolicy(cpu_threshold=0), **config)
    server = Server(models or doubles(), cfg, serve_config, monitor=monitor)
    task = asyncio.create_task(server.run())
    await asyncio.wait([task, asyncio.create_task(server.ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield Served(port, server, task)
    finally:
        if not task.done():
            server.drain()
            server.drain()  # at once
        await asyncio.wait_for(task, 30)


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
        # phone routes without a carrier's secret take the token too (signatures: test_carrier_signatures.py)
        with pytest.raises(InvalidStatus) as refused:
            async with connect(s.url("/twilio")):
                pass
        assert refused.value.response.status_code == 401
        async with connect(s.url("/twilio?token=s3cret")):
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


@pytest.mark.real_clock  # the engine's own threads keep the real time
async def test_free_recognizer_slots_follow_the_in_process_engine():
    from agent.serving.cli import _engine_of
    from asr.engine.recognizer import EngineRecognizer

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


# ---- admission by measured load, drain, TLS ----------------------------------------------------
class SetLoad(LoadMonitor):
    """The machine's CPU as the test sets it (`level`), not as this busy test machine's."""

    level = 0.0

    async def run(self, period_s: float = 0.5, on_lag=None) -> None:
        while True:
            self.observe(self.level, 0.0)
            await asyncio.sleep(0.05)


async def phone_call(url: str, seconds: float = 20.0) -> list[tuple[float, str, int]]:
    """A Twilio call (its documented messages, tests/media_stream_peers.py) sending silence at
    real time until the server closes it or `seconds` pass: (arrival time, kind, audio bytes)
    of what it read."""
    twilio = peer("twilio")
    read: list[tuple[float, str]] = []
    loop = asyncio.get_running_loop()
    async with connect(url) as ws:
        await ws.send(twilio.connected())
        await ws.send(twilio.start())

        async def reader():
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    kind, payload = twilio.read(message)
                    read.append((loop.time(), kind, len(payload) if kind == "audio" else 0))

        reading = asyncio.create_task(reader())
        deadline = loop.time() + seconds
        with contextlib.suppress(Exception):  # the server closing ends the call
            for chunk in itertools.count(1):
                if reading.done() or loop.time() > deadline:
                    break
                await ws.send(twilio.media(b"\xff" * 160, chunk))  # 20 ms of mu-law silence
                await asyncio.sleep(0.02)
        await asyncio.wait_for(reading, 10)
        read.append((loop.time(), f"closed {ws.close_code}", 0))
    return read


def audio_seconds(read: list[tuple[float, str, int]]) -> float:
    return sum(n for _, _, n in read) / 8000  # 8 kHz mu-law: a byte a sample


def tone_seconds(text: str) -> float:
    return ToneVoice().word_s * len(text.split())


def test_load_monitor_refuses_on_cpu_reservations_llm_queue_and_lag():
    now = [100.0]
    queue = [0]
    m = LoadMonitor(LoadPolicy(cpu_threshold=0.8, reservation=0.3, settle_s=4.0, window_s=3.0, max_llm_queue=2,
                               max_lag_s=0.25), llm_queue=lambda: queue[0], clock=lambda: now[0])
    m.observe(0.95, 0.0)
    assert m.reason(live=0) is None  # an idle server always takes one
    assert "CPU 95%" in m.reason(live=1)
    now[0] += 3.5  # the window moved past that reading
    m.observe(0.2, 0.0)
    assert m.reason(live=1) is None
    m.admitted()
    assert m.reason(live=2) is None  # 20% + 30%
    m.admitted()
    assert m.reason(live=3) is None  # 20% + 60% is not above 80%
    m.admitted()
    assert "90% reserved" in m.reason(live=4)
    now[0] += 4.5  # the reservations settled: their load is in the CPU readings by now
    m.observe(0.2, 0.0)
    assert m.reason(live=4) is None
    queue[0] = 3
    assert "3 replies wait for the LLM" in m.reason(live=4)
    queue[0] = 0
    m.observe(0.2, 0.4)
    assert "event loop is 400 ms late" in m.reason(live=4)
    assert LoadMonitor(LoadPolicy(cpu_threshold=0), clock=lambda: now[0]).reason(live=9) is None  # off


async def test_beyond_the_measured_load_a_page_gets_503_and_a_phone_hears_all_lines_are_busy():
    from agent.serving.server import BUSY

    monitor = SetLoad(LoadPolicy(cpu_threshold=0.8, window_s=0.5, settle_s=0.5))
    monitor.level = 0.95
    async with serving(monitor=monitor) as s:
        async with connect(s.url("/ws")):  # an idle server takes one whatever the load
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            status, _, body = await get(s.port, "/readyz")
            assert status == 503 and "busy: CPU 95%" in body
            assert await refused_status(s.url("/ws")) == 503
            read = await phone_call(s.url("/twilio"))
            assert read[-1][1] == "closed 1013"
            assert audio_seconds(read) == pytest.approx(tone_seconds(BUSY), abs=0.15)
            assert s.admission.live == 1  # the refused call was never a conversation
            monitor.level = 0.1  # the load went down: admitted again
            assert await await_until(lambda: s.admission.admitting, timeout=10)
            assert (await get(s.port, "/readyz"))[0] == 200
        samples = await metric_samples(s.port)
    assert samples[("duplex_sessions_total", (("result", "refused"),))] == 2
    assert 0.1 <= samples[("duplex_cpu_utilisation", ())] <= 0.8  # the average admission read last


async def test_a_refused_audiosocket_call_hears_the_busy_message_then_is_hung_up():
    from agent.serving.server import BUSY
    from transport.telephony.audiosocket import HANGUP, UUID, FrameParser, encode_frame

    asp = free_port()
    async with serving(max_sessions=1, audiosocket_port=asp) as s:
        async with connect(s.url("/ws")):
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            reader, writer = await asyncio.open_connection("127.0.0.1", asp)
            writer.write(encode_frame(UUID, bytes(range(16))))
            parser, audio_bytes, hung_up = FrameParser(), 0, False

            async def send_silence():
                while True:
                    writer.write(encode_frame(0x10, bytes(320)))  # 20 ms of 8 kHz PCM
                    await writer.drain()
                    await asyncio.sleep(0.02)

            sending = asyncio.create_task(send_silence())
            try:
                while not hung_up and (data := await asyncio.wait_for(reader.read(4096), 15)):
                    for frame in parser.feed(data):
                        audio_bytes += len(frame.payload) if frame.kind == 0x10 else 0
                        hung_up |= frame.kind == HANGUP
            finally:
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
                writer.close()
            assert hung_up
            assert audio_bytes / 2 / 8000 == pytest.approx(tone_seconds(BUSY), abs=0.15)


async def test_drain_lets_a_live_conversation_finish_and_refuses_new_ones():
    async with serving(drain_timeout_s=30) as s:
        talking = asyncio.create_task(page_conversation(s.url("/ws"), question(), RATE))
        assert await await_until(lambda: s.admission.live == 1, timeout=10)
        s.server.drain()
        status, _, body = await get(s.port, "/readyz")
        assert status == 503 and "draining" in body
        assert await refused_status(s.url("/ws")) == 503
        assert (await get(s.port, "/healthz"))[0] == 200  # alive while it drains
        log = await asyncio.wait_for(talking, 30)
        assert [e for e in log if e["type"] == "bot_done"] and not [e for e in log if e["type"] == "error"]
        await asyncio.wait_for(s.task, 10)  # the last conversation ended: the server is done


async def test_a_call_still_live_at_the_drain_timeout_hears_goodbye():
    from agent.serving.server import GOODBYE

    async with serving(drain_timeout_s=0.5) as s:
        call = asyncio.create_task(phone_call(s.url("/twilio")))
        assert await await_until(lambda: s.admission.live == 1, timeout=10)
        drained_at = asyncio.get_running_loop().time()
        s.server.drain()
        read = await asyncio.wait_for(call, 30)
        await asyncio.wait_for(s.task, 10)
    after = [r for r in read if r[0] > drained_at]
    assert after[-1][1] == "closed 1000"
    assert audio_seconds(after) == pytest.approx(tone_seconds(GOODBYE), abs=0.15)


async def test_tls_serves_https_and_wss(tmp_path):
    import ssl

    cert, key, trust = self_signed_cert(tmp_path)
    async with serving(certfile=str(cert), keyfile=str(key)) as s:
        def fetch():
            with urllib.request.urlopen(f"https://127.0.0.1:{s.port}/healthz", timeout=10, context=trust) as r:
                return r.status
        assert await asyncio.to_thread(fetch) == 200
        assert await refused_status(s.url("/ws", "wss"), ssl=trust) is None  # hello answered by ready
        with pytest.raises(InvalidMessage):  # plain WebSocket to a TLS port: no HTTP answer comes back
            async with connect(s.url("/ws"), open_timeout=5):
                pass
        with pytest.raises(ssl.SSLCertVerificationError):  # a certificate the client does not trust
            async with connect(s.url("/ws", "wss"), open_timeout=5, ssl=ssl.create_default_context()):
                pass


async def test_the_llm_queue_counts_replies_waiting_for_their_first_token():
    from agent.serving.load import QueuedLLM

    llm = QueuedLLM(ScriptedLLM("one two three", token_s=0.05))
    user = [{"role": "user", "content": "count"}]
    a, b = llm.stream(user), llm.stream(user)
    first_a, first_b = asyncio.create_task(anext(a)), asyncio.create_task(anext(b))
    assert await await_until(lambda: llm.waiting == 2, timeout=5)
    assert await first_a == "one" and await first_b == "one"
    assert llm.waiting == 0  # generating is not waiting
    await a.aclose()
    await b.aclose()
    c = llm.stream(user)
    never = asyncio.create_task(anext(c))
    assert await await_until(lambda: llm.waiting == 1, timeout=5)
    never.cancel()  # a reply cancelled before its first token leaves the queue
    await asyncio.gather(never, return_exceptions=True)
    assert llm.waiting == 0
