"""`duplex asr-serve` reports its capacity (issue 21, part 3): /healthz, /readyz (503 with the
reason when every slot is busy or while draining), /metrics (prometheus-client text, parsed with
its own parser) on the WebSocket's port, and a drain on SIGTERM that lets a live stream finish
and exits 0. Real sockets throughout; the recognizer is the Kyutai engine with tiny random
weights (it has steps to time; no speech model is needed to count slots)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from asr.base import RecognizerUnavailable
from asr.engine.kyutai import tiny_random
from asr.moshi_protocol import decode_server
from asr.remote import RemoteRecognizer
from asr.engine.scheduler import EngineScheduler, SchedulerConfig
from asr.serving.server import PATH, AsrServer

sys.path.insert(0, os.path.dirname(__file__))
from helpers import await_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SR = 24000
FRAME = 1920


def get(base: str, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


async def aget(base: str, path: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(get, base, path)


async def poll(check, timeout: float = 10.0) -> bool:
    """`await check()` until true (the in-process server runs on this loop: no blocking GETs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


def metrics(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def noise(frames: int, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(frames * FRAME)).astype(np.float32)


@contextlib.asynccontextmanager
async def engine_server(slots: int = 2):
    sched = EngineScheduler(tiny_random(slots, seed=0), SchedulerConfig())
    server = AsrServer(sched)
    async with sched, server.serving("127.0.0.1", 0) as port:
        yield server, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"


async def ready(http: str) -> bool:
    return (await aget(http, "/readyz"))[0] == 200


async def served(http: str, n: int) -> bool:
    return metrics((await aget(http, "/metrics"))[2])[("duplex_asr_streams_total", (("result", "served"),))] == n


async def test_readyz_healthz_and_metrics_follow_the_slots(tmp_path):
    async with engine_server(slots=2) as (server, http, ws):
        assert (await aget(http, "/healthz"))[0] == 200
        status, _, body = await aget(http, "/readyz")
        assert status == 200 and body == "ready\n"
        status, ctype, text = await aget(http, "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        m = metrics(text)
        assert m[("duplex_asr_slots", ())] == 2 and m[("duplex_asr_slots_free", ())] == 2
        assert m[("duplex_asr_streams_active", ())] == 0

        rec = RemoteRecognizer(ws)
        one, two = await rec.open_stream(), await rec.open_stream()
        for s in (one, two):
            await s.feed(noise(25, seed=id(s) % 100))
        await asyncio.wait_for(asyncio.gather(one.flush(2.0), two.flush(2.0)), 60)
        # A flush's marker comes back before the engine steps the silence sent after it: the
        # scrapes below read an engine that has stepped every frame sent, and steps no more.
        sched = server.recognizer
        assert await await_until(lambda: sorted(x.frames_done * FRAME for x in sched.sessions)
                                 == sorted(s.model_samples for s in (one, two)), timeout=30)
        status, _, body = await aget(http, "/readyz")
        assert status == 503 and "no free slot" in body and "2 slots" in body
        with pytest.raises(RecognizerUnavailable, match="no free slot"):
            await rec.open_stream()
        m = metrics((await aget(http, "/metrics"))[2])
        assert m[("duplex_asr_slots_free", ())] == 0 and m[("duplex_asr_streams_active", ())] == 2
        assert m[("duplex_asr_streams_total", (("result", "refused"),))] == 1
        steps = m[("duplex_asr_step_seconds_count", ())]
        assert steps >= 25 and m[("duplex_asr_step_seconds_sum", ())] > 0  # one step serves both rows
        assert m[("duplex_asr_audio_seconds_total", ())] == pytest.approx(server.recognizer.ticks * FRAME / SR)
        assert m[("duplex_asr_compute_seconds_total", ())] > 0 and m[("duplex_asr_real_time_factor", ())] > 0
        # steps are counted once: a second scrape adds only the new ones
        m2 = metrics((await aget(http, "/metrics"))[2])
        assert m2[("duplex_asr_step_seconds_count", ())] == server.recognizer.ticks

        await one.close()
        assert await poll(lambda: ready(http))
        three = await rec.open_stream()
        await three.close()
        await two.close()
        assert await poll(lambda: served(http, 3))

        server.drain()
        status, _, body = await aget(http, "/readyz")
        assert status == 503 and "draining" in body
        assert (await aget(http, "/healthz"))[0] == 200  # alive, only not ready
        with pytest.raises(RecognizerUnavailable, match="503"):
            await rec.open_stream()
        m = metrics((await aget(http, "/metrics"))[2])
        assert m[("duplex_asr_draining", ())] == 1
        assert m[("duplex_asr_streams_total", (("result", "refused"),))] == 2
        assert (await aget(http, "/nothing"))[0] == 404


def spawn_asr_serve(*args: str) -> tuple[subprocess.Popen, object]:
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 (closed by the caller)
    proc = subprocess.Popen([sys.executable, "-m", "agent.serving.cli", "asr-serve", "--port", "0", "--model", "tiny-random",
                             "--no-tune-convs", *args], env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def served_url(proc: subprocess.Popen, log) -> str:
    """The server's ws:// URL, once it says it serves."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log.name) as f:
            if m := re.search(r"asr-serve: .* on (ws://\S+)", f.read()):
                return m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"asr-serve did not start: {output(log)[-2000:]}")


# the subprocess tests' servers, by test
SERVES = {"drains": ("--slots", "2", "--drain-timeout", "20"), "drain_timeout": ("--slots", "1", "--drain-timeout", "1.5")}


@pytest.fixture(scope="module")
def asr_serve():
    """`asr_serve(name)`: (process, ws:// URL, log) of a fresh `duplex asr-serve` for one test
    (each ends its own with SIGTERM). All of them are started at the first one's asking: their
    start-ups (importing torch and transformers, seconds each) overlap."""
    started = {name: spawn_asr_serve(*args) for name, args in SERVES.items()}

    def take(name: str) -> tuple[subprocess.Popen, str, object]:
        proc, log = started[name]
        return proc, served_url(proc, log), log

    yield take
    for proc, log in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        with contextlib.suppress(FileNotFoundError):  # the test removed it
            os.unlink(log.name)


def output(log) -> str:
    with open(log.name) as f:
        return f.read()


async def test_sigterm_drains_a_live_stream_then_exits_zero(asr_serve):
    proc, url, log = asr_serve("drains")
    http = url.replace("ws://", "http://").removesuffix(PATH)
    try:
        rec = RemoteRecognizer(url, reconnect_timeout_s=1)
        stream = await rec.open_stream()
        await stream.feed(noise(10))
        await asyncio.wait_for(stream.flush(0.8), 60)
        proc.send_signal(signal.SIGTERM)
        assert await await_until(lambda: get(http, "/readyz")[0] == 503, timeout=5)
        assert "draining" in get(http, "/readyz")[2]
        with pytest.raises(RecognizerUnavailable, match="draining"):
            await RemoteRecognizer(url).open_stream()
        # the live stream goes on: more audio, another flush answered
        await stream.feed(noise(15, seed=1))
        await asyncio.wait_for(stream.flush(2.0), 60)
        assert stream.gaps == 0 and proc.poll() is None
        await stream.close()
        t0 = time.monotonic()
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc == 0, output(log)[-3000:]
        assert time.monotonic() - t0 < 10, "it exits once the last stream ends, not at the drain timeout"
        assert "drained" in output(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.unlink(log.name)


async def test_drain_timeout_closes_a_stream_that_does_not_end_and_exits_zero(asr_serve):
    proc, url, log = asr_serve("drain_timeout")
    try:
        async with websockets.connect(url, additional_headers={"kyutai-api-key": "public_token"}) as ws:
            assert decode_server(await asyncio.wait_for(ws.recv(), 30))["type"] == "Ready"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                async with asyncio.timeout(20):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # going away
            assert 1.0 <= time.monotonic() - t0 < 10
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc == 0, output(log)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.unlink(log.name)
