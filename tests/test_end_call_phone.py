"""end_call over a phone line: `duplex serve`'s own Server (agent.serving.server) with the test doubles
for models and an agent whose scripted LLM calls end_call when the caller says goodbye. The test
plays Twilio (tests/test_telephony_e2e.py's FakeProvider: real time, marks echoed as playback
reaches them), here one whose playback starts a second late (a carrier's jitter buffer): the
server's own clock says the goodbye has played a second before the caller has heard it, so only
its last mark can tell. The goodbye must be played to its end, and its last mark echoed, before
the server closes the media stream."""
from __future__ import annotations

import asyncio
import contextlib
import time
import warnings

import numpy as np
import pytest
import websockets

from agent import Agent, ToolPolicy
from agent.conversation.endpointing import SilencePolicy
from agent.toolkit.call_control import end_call
from agent.serving.load import LoadPolicy
from agent.serving.server import ServeConfig, Server
from agent.conversation.session import Models, SessionConfig
from doubles import EnergyVAD, ScriptedRecognizer, ToneVoice, ToolScriptLLM, burst, said
from helpers import free_port
from llm.base import ToolCall
from media_stream_peers import peer
from test_telephony_e2e import FakeProvider

pytestmark = pytest.mark.usefixtures("virtual_clock")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")


LATE_S = 1.0  # the far end's playback starts this long after the first audio arrives


def goodbye(messages, tools):
    if messages[-1]["role"] == "tool":
        return said("Goodbye, thank you for calling.")
    return [ToolCall("c1", "end_call", "{}")]


async def test_the_caller_says_goodbye_and_the_stream_closes_after_the_goodbyes_mark():
    llm = ToolScriptLLM(goodbye)
    models = Models(asr=ScriptedRecognizer(["thanks that is all goodbye"]), llm=llm, tts=ToneVoice(sample_rate=8000),
                    vad_factory=EnergyVAD)
    cfg = SessionConfig(speculate=False)
    cfg.turns.endpointing = SilencePolicy()
    port = free_port()
    server = Server(models, cfg, ServeConfig(port=port, load=LoadPolicy(cpu_threshold=0)),
                    agent=Agent(tools=[end_call], tool_policy=ToolPolicy(filler_delay_s=5.0)))
    task = asyncio.create_task(server.run())
    await asyncio.wait_for(server.ready.wait(), 30)
    caller = np.concatenate([np.zeros(2400, np.float32), burst(0.8)[::2], np.zeros(8000 * 15, np.float32)])
    pcm = (np.clip(caller, -1, 1) * 32767).astype(np.int16)
    closed_at = None
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/twilio") as ws:
            twilio = FakeProvider(ws, peer("twilio"))
            await ws.send(twilio.far.connected())
            await ws.send(twilio.far.start())
            twilio.t0 = time.perf_counter()
            reader = asyncio.create_task(twilio.read())
            with contextlib.suppress(websockets.ConnectionClosed):
                for k, i in enumerate(range(0, pcm.size - 160 + 1, 160)):
                    await asyncio.sleep(max(0.0, twilio.t0 + k * 0.02 - time.perf_counter()))
                    if reader.done():
                        break
                    await ws.send(twilio.far.media(audioop.lin2ulaw(pcm[i:i + 160].tobytes(), 2), chunk=k + 1))
                    first_audio = next((t for t, kind, _ in twilio.log if kind == "media"), None)
                    if first_audio is not None and twilio.now() - first_audio >= LATE_S:
                        await twilio.play_one_frame()
            with contextlib.suppress(websockets.ConnectionClosed):
                await asyncio.wait_for(reader, 10)
            closed_at = twilio.now()
    finally:
        server.drain()
        server.drain()
        await asyncio.wait_for(task, 30)
    assert closed_at is not None and closed_at < 12, "the server closed the call"
    assert [m["role"] for m in llm.requests[-1]][-2:] == ["assistant", "tool"], "end_call ran"
    marks = [(t, name) for t, kind, name in twilio.log if kind == "mark"]
    echoes = {name: t for t, kind, name in twilio.log if kind == "echo"}
    last_end = max((name for _, name in marks if name.startswith("e")), key=lambda n: int(n[1:]))
    assert last_end in echoes, "the goodbye was played to its end"
    assert closed_at >= echoes[last_end], "the stream closed only after the goodbye's last mark came back"
    heard = sum(np.abs(f).max() > 64 for f in twilio.played) * 0.02
    assert heard >= 0.12 * 5 * 0.9, "the caller heard the goodbye (5 words of tone)"
