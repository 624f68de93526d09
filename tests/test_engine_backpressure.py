"""A client pushing one hour of audio as fast as it can: the server's buffer stays capped, the
client's sends block (TCP backpressure) and memory stays flat."""

from __future__ import annotations

import asyncio
import os
import sys

import msgpack
import numpy as np
import pytest
import websockets

sys.path.insert(0, os.path.dirname(__file__))
from helpers import kernel_socket_buffer_bytes  # noqa: E402
from test_engine_server import KEY, recv, running_server  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SECOND = 24000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_fast_client_is_pushed_back_and_memory_stays_flat():
    rng = np.random.default_rng(0)
    one_second = msgpack.packb({"type": "Audio", "pcm": (rng.standard_normal(SECOND) * 0.1).astype(np.float32).tolist()},
                               use_single_float=True)
    hour = 3600
    async with running_server(slots=2, buffer_seconds=10.0) as (sched, _, url):
        # close_timeout: the server reads our close frame only after the audio queued before it.
        async with websockets.connect(url, additional_headers=KEY, compression=None, close_timeout=0.5) as ws:
            assert (await recv(ws))["type"] == "Ready"
            session = sched.sessions[0]
            cap = session.capacity
            sent = 0
            reported = []

            async def push():
                nonlocal sent
                for _ in range(hour):
                    await ws.send(one_second)
                    sent += 1

            async def drain():
                async for raw in ws:
                    reported.append(msgpack.unpackb(raw)["buffered_pcm"])

            pusher = asyncio.create_task(push())
            drainer = asyncio.create_task(drain())
            samples, rss = [], []
            for i in range(25):  # 2.5 s: the client is held within the first 0.1 s, and stays held
                await asyncio.sleep(0.1)
                processed_s = session.frames_done * 1920 / SECOND
                samples.append((sent, processed_s, session.buffered_samples))
                rss.append(rss_bytes())
            pusher.cancel()
            drainer.cancel()
            await asyncio.gather(pusher, drainer, return_exceptions=True)

    assert session.max_buffered <= cap, "server buffered more audio than its cap"
    assert max(reported) <= cap
    assert max(b for *_, b in samples) <= cap
    # Everything the client managed to send is either processed, in the capped buffer, or in
    # bounded transit: websockets' 2-frame queue, one frame being parsed, and the kernel's socket
    # buffers (at most tcp_wmem + tcp_rmem maxima): the client cannot run ahead, its sends block.
    slack_s = 3 + kernel_socket_buffer_bytes() / len(one_second)
    for sent_s, processed_s, _ in samples:
        assert sent_s <= processed_s + cap / SECOND + slack_s
    assert sent < hour, "the client should still be blocked, far from done"
    assert samples[-1][1] > 0, "the server kept processing"
    # The flood offers 415 MB (an hour as msgpack floats): buffering it would show as hundreds of
    # MiB. The margin is for what else lives in the test process (the allocator's arenas, torch's
    # caches, earlier tests' garbage), which moves RSS by a few MiB on its own.
    growth = max(rss[10:]) - rss[10]
    assert growth < 16 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB while being flooded"
