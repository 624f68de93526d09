"""The moshi-compatible ASR server over real WebSockets on 127.0.0.1: admission, errors, timeouts."""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import numpy as np
import pytest
import websockets

from asr.engine.kyutai import tiny_random
from asr.moshi_protocol import decode_server
from asr.engine.scheduler import EngineScheduler, SchedulerConfig
from asr.serving.server import PATH, AsrServer
from helpers import await_until

pytestmark = pytest.mark.usefixtures("one_torch_thread", "virtual_clock")  # server, clients and engine steps on the test's loop

FRAME = 1920
KEY = {"kyutai-api-key": "public_token"}


@contextlib.asynccontextmanager
async def running_server(slots: int = 2, **cfg):
    sched = EngineScheduler(tiny_random(slots, seed=0), SchedulerConfig(**cfg))
    server = AsrServer(sched)
    async with sched, server.serving() as port:
        yield sched, server, f"ws://127.0.0.1:{port}{PATH}"


async def recv(ws, timeout: float = 10.0) -> dict:
    return decode_server(await asyncio.wait_for(ws.recv(), timeout))


async def recv_until(ws, kind: str, timeout: float = 20.0) -> tuple[dict, list[dict]]:
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            m = await recv(ws, timeout)
            seen.append(m)
            if m["type"] == kind:
                return m, seen


def audio_msg(samples) -> bytes:
    return msgpack.packb({"type": "Audio", "pcm": [float(x) for x in samples]}, use_single_float=True)


async def test_stream_gets_ready_steps_and_marker():
    async with running_server() as (sched, _, url):
        async with websockets.connect(url, additional_headers=KEY) as ws:
            assert (await recv(ws))["type"] == "Ready"
            rng = np.random.default_rng(0)
            await ws.send(audio_msg(rng.standard_normal(10 * FRAME) * 0.1))
            await ws.send(msgpack.packb({"type": "Marker", "id": 42}))
            await ws.send(audio_msg(np.zeros(24000)))  # the marker needs the ASR delay worth of audio
            marker, seen = await recv_until(ws, "Marker")
            assert marker["id"] == 42
            steps = [m for m in seen if m["type"] == "Step"]
            assert [s["step_idx"] for s in steps] == list(range(1, len(steps) + 1))
            assert len(steps) >= 10 + sched.model.asr_delay_frames
            assert all("buffered_pcm" in m for m in seen)


async def test_wrong_key_and_wrong_path_are_refused():
    async with running_server() as (_, _, url):
        with pytest.raises(websockets.InvalidStatus) as e:
            async with websockets.connect(url, additional_headers={"kyutai-api-key": "nope"}):
                pass
        assert e.value.response.status_code == 401
        with pytest.raises(websockets.InvalidStatus) as e:
            async with websockets.connect(url.replace(PATH, "/other"), additional_headers=KEY):
                pass
        assert e.value.response.status_code == 404
        async with websockets.connect(url + "?auth_id=public_token") as ws:
            assert (await recv(ws))["type"] == "Ready"


async def test_connection_beyond_pool_gets_no_free_slot_then_slot_is_reused():
    async with running_server(slots=2) as (sched, _, url):
        a = await websockets.connect(url, additional_headers=KEY)
        b = await websockets.connect(url, additional_headers=KEY)
        assert (await recv(a))["type"] == "Ready" and (await recv(b))["type"] == "Ready"
        c = await websockets.connect(url, additional_headers=KEY)
        err = await recv(c)
        assert err["type"] == "Error" and "no free slot" in err["message"]
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(c.recv(), 5)
        assert c.close_code == 1013
        slot_a = next(s.slot for s in sched.sessions)
        await a.close()
        async with asyncio.timeout(5):
            while len(sched.sessions) != 1:
                await asyncio.sleep(0.01)
        d = await websockets.connect(url, additional_headers=KEY)
        assert (await recv(d))["type"] == "Ready"
        reused = [s for s in sched.sessions if s.slot == slot_a]
        assert reused and reused[0].needs_reset
        ticks = sched.ticks
        await d.send(audio_msg(np.zeros(FRAME)))
        step, _ = await recv_until(d, "Step")
        assert step["step_idx"] == 1 and sched.ticks == ticks + 1  # the freed slot served within one tick
        await b.close()
        await d.close()


async def test_late_output_never_reaches_next_user():
    """Results of a step computed for a session closed mid-step are dropped by generation id."""
    async with running_server(slots=1) as (sched, _, url):
        first = await sched.open_session()
        await first.feed(np.zeros(40 * FRAME, np.float32))
        await asyncio.sleep(0)  # let one step start
        await first.close()
        second = await sched.open_session()
        assert second.slot == first.slot and second.gen == first.gen + 1
        await second.feed(np.zeros(3 * FRAME, np.float32))
        got = []
        async with asyncio.timeout(10):
            while len([m for m in got if type(m).__name__ == "Step"]) < 3:
                got += await second.messages()
        steps = [m.step_idx for m in got if type(m).__name__ == "Step"]
        assert steps == [1, 2, 3]
        await second.close()


async def test_idle_session_is_evicted_and_slot_freed():
    async with running_server(slots=1, idle_timeout_s=0.3) as (sched, _, url):
        async with websockets.connect(url, additional_headers=KEY) as ws:
            assert (await recv(ws))["type"] == "Ready"
            err, _ = await recv_until(ws, "Error", timeout=5)
            assert "idle timeout" in err["message"]
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        async with asyncio.timeout(5):
            while sched.sessions:
                await asyncio.sleep(0.01)
        async with websockets.connect(url, additional_headers=KEY) as ws:
            assert (await recv(ws))["type"] == "Ready"


async def test_max_session_length_evicts():
    async with running_server(slots=1, max_session_s=0.4) as (sched, _, url):
        async with websockets.connect(url, additional_headers=KEY) as ws:
            assert (await recv(ws))["type"] == "Ready"
            with contextlib.suppress(websockets.ConnectionClosed):
                for _ in range(40):  # keeps the session busy (never idle) until evicted
                    await ws.send(audio_msg(np.zeros(FRAME)))
                    await asyncio.sleep(0.05)
            err, _ = await recv_until(ws, "Error", timeout=5)
            assert "maximum session length" in err["message"]


async def test_admission_wait_gets_slot_when_freed():
    async with running_server(slots=1, admission_wait_s=5.0) as (sched, _, url):
        first = await sched.open_session()
        waiter = asyncio.create_task(sched.open_session())
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await first.close()
        second = await asyncio.wait_for(waiter, 5)
        assert second.slot == first.slot
        await second.close()


async def test_a_waiter_cancelled_as_the_slot_frees_goes_without_it():
    """The caller has gone (its task cancelled) in the very step a slot frees: it must not take the
    slot, which no one would then close (3.11's wait_for swallowed that cancel)."""
    async with running_server(slots=1, admission_wait_s=5.0) as (sched, _, url):
        first = await sched.open_session()
        waiter = asyncio.create_task(sched.open_session())
        assert await await_until(lambda: bool(sched._freed._waiters), 5)
        await first.close()  # frees the slot and wakes the waiter: nothing has run since
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert sched.sessions == [] and len(sched._free) == 1


async def test_flush_gets_last_words_out():
    async with running_server(slots=1) as (sched, _, url):
        s = await sched.open_session()
        await s.feed(np.zeros(5 * FRAME + 100, np.float32))
        await s.flush()
        want = 6 + sched.model.asr_delay_frames + sched.config.flush_extra_frames
        got = []
        async with asyncio.timeout(10):
            while not any(type(m).__name__ == "Step" and m.step_idx == want for m in got):
                got += await s.messages()
        assert s.buffered_samples == 0
        await s.close()
