"""`duplex serve --asr DIR` with the in-process engine: browser-protocol conversations at once, one
engine slot each, one batched step per frame for all of them, a freed slot reused by the next
conversation, a clear refusal beyond the slots, and the words each conversation gets are the
words the engine gives for that audio alone.

DIR is a tiny random checkpoint written as `python -m asr.engine.kyutai --save-tiny DIR --words` does
(loaded through `from_pretrained`, as a hub id is); the LLM and voice are test doubles."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.conversation.endpointing import SilencePolicy
from agent.conversation.config import Models
from agent.conversation.listener import Listener, TurnEnded, UserTranscript
from agent.conversation.session import Session, SessionConfig
from agent.tracing.trace import NullTracer
from asr.engine.recognizer import EngineRecognizer
from asr.engine.kyutai import save_tiny
from doubles import EnergyVAD, ScriptedLLM, ToneVoice, burst
from helpers import await_until, free_port, page_conversation
from transport.base import AudioIn
from transport.web.server import run_server

# the engine's own rate, so no resampler's lag sits between the client's audio and the engine:
# then the silence a flush inserts always lands in the clip's own silence, wherever the flush
# finds the stream (a resampler holds back the burst's last samples, which a flush made at
# another moment would split from the rest by its zeros)
RATE = 24000
SLOTS = 4
FRAME = 480  # 20 ms, as the page sends
SETTLE_S = 0.5  # the tiny model's delay (0.16 s), the flush margin (0.16 s) and a frame to spare

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load(checkpoint, slots: int) -> EngineRecognizer:
    """The checkpoint's engine with every conv on oneDNN: timing the conv paths (tune_convs, the
    default for a directory) takes seconds per load and may pick other paths for the 4-slot engine
    than for the 1-slot reference."""
    return EngineRecognizer.load(checkpoint, slots=slots, tune_convs=False)


def clip(seed: int) -> np.ndarray:
    speech = np.repeat(burst(3.0, seed=seed), 3)[::2]  # 16 kHz noise held to 24 kHz
    return np.concatenate([np.zeros(int(0.3 * RATE), np.float32), speech, np.zeros(int(1.2 * RATE), np.float32)])


def config() -> SessionConfig:
    cfg = SessionConfig(speculate=False)
    cfg.turns.endpointing = SilencePolicy()
    return cfg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "stt", seed=0, words=True)


async def reference_words(checkpoint, audio: np.ndarray) -> tuple[list[tuple[str, float]], float]:
    """The turn's words (text, start) and its end of speech from the same engine, this audio alone
    in it (its own listener, fed as the server's is: the same 20 ms pieces, VAD and turn rules)."""
    asr = load(checkpoint, 1)
    finals: list[UserTranscript] = []
    ends: list[TurnEnded] = []

    async def emit(ev):
        if isinstance(ev, UserTranscript):
            finals.append(ev)
        elif isinstance(ev, TurnEnded):
            ends.append(ev)

    listener = Listener(asr, EnergyVAD(), None, config().listener(), NullTracer(), emit)
    await listener.open()
    for i in range(0, audio.size, FRAME):
        await listener.on_audio(AudioIn(audio[i:i + FRAME], RATE))
    assert await await_until(lambda: finals, timeout=30)
    await listener.close()
    await asr.aclose()
    return [(w.text, w.start) for w in finals[0].words], ends[0].t_speech_end


def settled(words, speech_end: float) -> list[str]:
    """The words that began well before the end of speech. The last one or two the flush closes:
    a random model's "word" runs on until it happens to emit a boundary token, so whether it is
    out by the flush's marker depends on how much silence the model has seen by then, which
    depends on when the flush ran against the incoming audio (not on the other slots)."""
    return [text for text, start in words if start < speech_end - SETTLE_S]


async def talk(port: int, audio: np.ndarray, log: list[dict], hold: asyncio.Event | None = None) -> None:
    await page_conversation(f"ws://127.0.0.1:{port}/ws", audio, RATE, log, hold)


@pytest.mark.usefixtures("virtual_clock")  # server, clients and engine steps (thread jobs) on this loop
async def test_conversations_share_the_engine_one_slot_each(checkpoint):
    asr = load(checkpoint, SLOTS)
    models = Models(asr=asr, llm=ScriptedLLM("OK."), tts=ToneVoice(), vad_factory=EnergyVAD)
    sessions: list[Session] = []

    async def handler(transport):
        session = Session(models, transport, config(), session_id=f"web{len(sessions)}")
        sessions.append(session)
        await session.run()

    port = free_port()
    ready = asyncio.Event()
    server = asyncio.create_task(run_server(handler, "127.0.0.1", port, 16000, ready))
    await ready.wait()
    try:
        audio = [clip(seed) for seed in range(SLOTS)]
        logs: list[list[dict]] = [[] for _ in range(SLOTS)]
        hold = asyncio.Event()
        clients = [asyncio.create_task(talk(port, a, log, hold)) for a, log in zip(audio, logs)]
        assert await await_until(lambda: len(sessions) == SLOTS and all(
            any(e["type"] == "bot_done" for e in log) for log in logs), timeout=60)
        sched = asr.scheduler

        # each conversation held its own slot
        slots = [s.listener.stream.link.session.slot for s in sessions]
        assert sorted(slots) == list(range(SLOTS))

        # one batched step per frame for all of them: the ticks are about one conversation's
        # frames (not four times as many), and the steps held all four rows
        frames_each = sessions[0].listener.stream.link.session.frames_done
        assert sched.ticks <= frames_each * 1.2 + 20, (sched.ticks, frames_each)
        rows = list(sched.active_rows)[-sched.ticks:]
        print(f"ticks {sched.ticks}, frames per conversation {frames_each}, rows per step {np.mean(rows):.2f}")
        assert np.mean(rows) >= 3.0 and rows.count(SLOTS) >= 0.6 * len(rows), rows

        # a conversation beyond the slots is told so, and the page gets nothing else
        extra: list[dict] = []
        await asyncio.wait_for(talk(port, np.zeros(int(0.2 * RATE), np.float32), extra), 30)
        (err,) = [e for e in extra if e["type"] == "error"]
        assert err["code"] == "no_recognizer" and err["fatal"] and "busy" in err["message"]

        # the words each conversation received are the engine's words for its audio alone
        for a, log in zip(audio, logs):
            (final,) = [e for e in log if e["type"] == "final"]
            (endpoint,) = [e for e in log if e["type"] == "endpoint"]
            got = settled([(w[0], w[1]) for w in final["words"]], endpoint["speech_end_stream_s"])
            want_words, want_end = await reference_words(checkpoint, a)
            assert abs(want_end - endpoint["speech_end_stream_s"]) < 0.01
            assert len(got) >= 3, f"too few words to compare: {final['words']}"
            assert got == settled(want_words, want_end)
            print("words:", got)

        # a closed conversation's slot goes to the next one
        hold.set()
        await asyncio.gather(*clients)
        assert await await_until(lambda: not asr.scheduler.sessions, timeout=10)
        again: list[dict] = []
        await asyncio.wait_for(talk(port, clip(9), again), 30)
        assert not [e for e in again if e["type"] == "error"]
        assert sessions[-1].listener.stream.link.session.slot == 0  # the lowest free slot, reused
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        await asr.aclose()
