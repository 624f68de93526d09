"""`duplex serve` as a process: SIGTERM drains it. A live conversation finishes its turn while
`/readyz` says 503 and a new conversation is refused; then the process exits 0."""
from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest

from helpers import await_until, duplex_serve_process, flite_available, page_conversation, say, silence
from test_serving import get, refused_status

pytestmark = [pytest.mark.models, pytest.mark.skipif(not flite_available(), reason="needs flite")]
RATE = 16000


async def test_sigterm_lets_the_live_conversation_finish_refuses_new_ones_and_exits_0(tmp_path):
    question = np.concatenate([silence(0.3), say("What is the capital of France?", tmp_path / "q.wav"),
                               silence(1.5)])
    with duplex_serve_process("--llm", "smollm2-135m", "--no-eou", "--drain-timeout", "60") as (port, proc):
        url = f"ws://127.0.0.1:{port}/ws"
        log: list[dict] = []
        hold = asyncio.Event()
        talking = asyncio.create_task(page_conversation(url, question, RATE, log=log, hold=hold, timeout=60))
        # the question is being heard (a partial), or was (its turn ended before a partial came, on
        # a busy machine): the conversation is live, its answer not yet given
        live = ("partial", "endpoint")
        await await_until(lambda: any(e["type"] in live for e in log) or talking.done(), timeout=30)
        assert any(e["type"] in live for e in log), log
        assert not any(e["type"] == "bot_done" for e in log), "answered before the drain began"
        proc.send_signal(signal.SIGTERM)
        for _ in range(100):  # the signal is handled on the server's loop: soon, not at once
            status, _, body = await get(port, "/readyz")
            if status == 503:
                break
            await asyncio.sleep(0.05)
        assert status == 503 and "draining" in body
        assert await refused_status(url) == 503
        # the live turn is answered to its end
        await await_until(lambda: any(e["type"] in ("bot_done", "error") for e in log), timeout=60)
        assert [e for e in log if e["type"] == "bot_done"], log
        assert not [e for e in log if e["type"] == "error"], log
        assert proc.poll() is None  # still serving the one who stayed
        hold.set()  # the caller hangs up
        await talking
        assert await asyncio.to_thread(proc.wait, 30) == 0
