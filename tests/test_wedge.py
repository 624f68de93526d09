"""The wedge of issue 17, as a regression test: conversations dropped without a close while the
real llama.cpp model answers them (mid-question, while it generates, while its audio plays),
several at once, must leave the server able to serve a full conversation right after.

What wedged: a conversation gone mid-reply left the one llama.cpp thread waiting for a reader
that would never ask again; every warm-up of later conversations queued behind it on asyncio's
default executor, and with them every `to_thread` of the process (VAD, ASR). The server then
answered HTTP but no conversation. The parts under test are real: duplex serve's Server, the
browser transport over loopback sockets, the session, and the embedded llama.cpp model; the
recognizer, VAD and voice are the test doubles (their cost is not what wedged)."""
from __future__ import annotations

import asyncio
import contextlib
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agent.conversation.config import Models
from doubles import EnergyVAD, ScriptedRecognizer, ToneVoice, burst
from helpers import await_until, page_conversation
from test_serving import RATE, question, serving
from transport.web.client import pcm16_frames

pytestmark = pytest.mark.models

# where a conversation is dropped: the event after which its TCP connection is cut
DROP_POINTS = ("mid-question", "endpoint", "first-audio")


@pytest.fixture(scope="module")
def llm():
    from llm import load_chat_model

    return load_chat_model("smollm2-135m")


# what a page dropped at each point has seen last when it goes
LAST_SEEN = {"mid-question": "connected", "endpoint": "endpoint", "first-audio": "first-audio"}


async def dropped_conversation(url: str, point: str) -> str:
    """A page that goes away without a close frame at `point`; what it had seen last then."""
    audio = np.concatenate([burst(1.2, seed=3), np.zeros(int(2.0 * RATE), np.float32)])
    frames = pcm16_frames(audio, RATE)
    ws = await connect(url)
    seen = asyncio.Event()
    last = "connected"

    async def read() -> None:
        nonlocal last
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                if isinstance(message, bytes):
                    last = "first-audio"
                elif json.loads(message).get("type") == "endpoint":  # the turn ended: the LLM is asked
                    last = "endpoint"
                if last == point:
                    seen.set()
                    return  # what comes after the drop point is not read

    reader = asyncio.create_task(read())
    try:
        await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))
        for i, frame in enumerate(frames):
            if seen.is_set() or (point == "mid-question" and i == 30):
                break
            await ws.send(frame)
            await asyncio.sleep(0.02)
        else:
            await asyncio.wait_for(seen.wait(), 30)
        return last
    finally:
        ws.transport.abort()  # gone: a dropped network, a killed tab
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_conversations_dropped_mid_reply_leave_the_server_serving(llm):
    models = Models(asr=ScriptedRecognizer(["tell me a long story about the sea"] * 64), llm=llm,
                    tts=ToneVoice(), vad_factory=EnergyVAD)
    async with serving(models=models, drain_timeout_s=1) as s:
        for _ in range(2):
            for point in DROP_POINTS:  # three at once, each dropped at the same point
                assert await asyncio.gather(*(dropped_conversation(s.url("/ws"), point) for _ in range(3))) \
                    == [LAST_SEEN[point]] * 3
        assert await await_until(lambda: s.admission.live == 0, timeout=30), "dropped conversations still live"
        # the model was let go: a new generation can start at once
        assert await asyncio.to_thread(llm._lock.acquire, True, 10), "the model is still held"
        llm._lock.release()
        log = await page_conversation(s.url("/ws"), question(), RATE, timeout=60)
    (done,) = [e for e in log if e["type"] == "bot_done"]
    assert done["text"].strip()
    assert not [e for e in log if e["type"] == "error"]
