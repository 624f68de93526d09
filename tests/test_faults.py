"""Faults a conversation survives (issue 17, section 6), each with a real peer that really fails:
an `--llm URL` server (llama.cpp's own OpenAI-compatible server, `python -m llama_cpp.server`,
on the bundled SmolLM2 GGUF) that is not started, killed with SIGKILL mid-reply, stopped with
SIGSTOP (before a reply, and mid-reply), or reached through a TCP proxy that cuts the connection
mid-answer; and a real voice that fails on one chunk of an answer.

Each LLM fault: the user hears the spoken apology after whatever was already said, the turn's
record (and its latency event) carries the error, the page gets a non-fatal `reply_failed`
error, the session goes on listening, and the next turn, with the server healthy again, gets a
real answer from it. The recognizer and the VAD are test doubles (tests/doubles.py): the LLM
client and the voice are what is under test here.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import psutil
import pytest
from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice, burst
from helpers import await_until, flite_available, free_port

from agent.conversation.endpointing import SilencePolicy
from agent.conversation.reply import LLM_APOLOGY, TTS_SKIP
from agent.conversation.session import Models, Session, SessionConfig
from agent.tracing.trace import Ev, Stage, Tracer
from llm.openai_compat import OpenAICompatChat
from transport.events import StateChanged
from transport.wavfile import ScriptedTurn, WavConversationTransport

RATE = 16000
# --llm-timeout (default 5 s): generous where the server is healthy (a small CPU may be busy
# with other work, and a first token then takes seconds), short where a stall is made
HEALTHY_S = 30.0
STALL_S = 3.0
STORY = "tell me a long story about a fox who lives in the forest"
QUESTION = "what is the capital of France"


# ---- a real llama.cpp server, and a proxy that cuts ---------------------------------------------
class LlamaServer:
    """`python -m llama_cpp.server` on the bundled SmolLM2 on `port`, started and stopped from
    an async test without blocking its event loop (the session runs in real time beside it)."""

    def __init__(self, port: int, log_dir):
        self.port, self.log_dir = port, log_dir
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    async def start(self) -> LlamaServer:
        from llm.bundled import smollm2_135m

        self.starts += 1
        # to a file: a pipe would fill and stall it
        self.log = log = open(self.log_dir / f"server-{self.port}-{self.starts}.log", "w+b")  # noqa: SIM115, ASYNC230
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_135m()), "--host", "127.0.0.1",
                "--port", str(self.port), "--n_ctx", "2048", "--verbose", "False"]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220 - returns at once
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(self._answers):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                log.seek(0)
                pytest.fail("llama_cpp.server did not start: " + log.read().decode(errors="replace")[-2000:])
            await asyncio.sleep(0.2)
        return self

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/models", timeout=1) as r:
            return r.status == 200
        return False

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process dies only once it runs
            self.proc.kill()
            self.proc.wait(30)
        if self.proc is not None:
            self.log.close()


@pytest.fixture
def llama_servers(tmp_path):
    """Makes `LlamaServer`s; kills every process they started at the end (SIGCONT, SIGKILL)."""
    made: list[LlamaServer] = []

    def make(port: int | None = None) -> LlamaServer:
        made.append(LlamaServer(port or free_port(), tmp_path))
        return made[-1]

    yield make
    for server in made:
        server.kill()


class CuttingProxy:
    """A TCP proxy to `upstream` that, when armed, cuts the connection in the middle of a
    streamed answer: it forwards the first `cut_after` server-sent events and half of the next
    one, then closes both sides (the client reads an HTTP body that stops mid-chunk)."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.cut_after: int | None = None
        self.cuts = 0
        self.server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task] = set()

    async def start(self) -> CuttingProxy:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self

    async def close(self) -> None:
        self.server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _connection(self, c_reader, c_writer) -> None:
        u_reader, u_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def up() -> None:  # client -> server
            while data := await c_reader.read(65536):
                u_writer.write(data)
                await u_writer.drain()

        async def down() -> None:  # server -> client, cut when armed
            events = 0
            while data := await u_reader.read(65536):
                if self.cut_after is not None:
                    marks = [m.start() for m in re.finditer(rb"data: \{", data)]
                    if events + len(marks) > self.cut_after:
                        nxt = marks[self.cut_after - events]  # the event to cut in two
                        c_writer.write(data[:nxt + 20])
                        await c_writer.drain()
                        self.cut_after, self.cuts = None, self.cuts + 1
                        return
                    events += len(marks)
                c_writer.write(data)
                await c_writer.drain()

        pumps = [asyncio.create_task(up()), asyncio.create_task(down())]
        self._pumps.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps.difference_update(pumps)
            for w in (c_writer, u_writer):
                w.close()


def open_connections(port: int) -> list:
    """This process's TCP connections to `port` that are still held: open, or closed by the
    peer but not by us (CLOSE_WAIT: an abandoned response nobody closed)."""
    return [c for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status in (psutil.CONN_ESTABLISHED, psutil.CONN_CLOSE_WAIT)]


# ---- the conversation ----------------------------------------------------------------------------
class SpyVoice(ToneVoice):
    """The tone voice, noting every text it was asked to speak."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    async def stream(self, text_chunks):
        async def noted():
            async for text in text_chunks:
                self.texts.append(text.strip())
                yield text

        async for chunk in super().stream(noted()):
            yield chunk


class HeldFarEnd:
    """The WAV far end, made to wait before its next input while `hold()` is on (it starts the
    next input only once the bot is no longer busy): the test brings the server back first."""

    def __init__(self, inner: WavConversationTransport):
        self.inner = inner
        self.reports_playout = inner.reports_playout
        self._held = asyncio.Event()
        self._idle: StateChanged | None = None

    def hold(self) -> None:
        self._held.set()

    async def release(self) -> None:
        self._held.clear()
        if self._idle is not None:
            await self.inner.send_event(self._idle)
            self._idle = None

    async def send_event(self, event) -> None:
        if isinstance(event, StateChanged):
            self._idle = None  # only the latest state counts
            if self._held.is_set() and not event.busy:
                self._idle = event
                event = dataclasses.replace(event, busy=True)
        await self.inner.send_event(event)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def start_conversation(tmp_path, script: list[str], llm, voice=None, **cfg):
    """A Session over the WAV far end, speaking `script` (one noise burst per line), running as
    a task beside the test, which injects the faults."""
    turns = [ScriptedTurn(np.concatenate([np.zeros(int(0.3 * RATE), np.float32), burst(0.8)]), RATE)]
    turns += [ScriptedTurn(burst(0.8, seed=k), RATE) for k in range(1, len(script))]
    wav = WavConversationTransport(turns, RATE, str(tmp_path / "out.wav"), gap_s=0.3, reply_timeout_s=40.0)
    far = HeldFarEnd(wav)
    config = SessionConfig(speculate=False, max_tokens=24, **{
        "system_prompt": "You are a storyteller. Answer with long, detailed stories.", "llm_timeout_s": HEALTHY_S,
        **cfg})
    config.turns.endpointing = SilencePolicy()  # silence alone ends turns
    session = Session(Models(asr=ScriptedRecognizer(script), llm=llm, tts=voice or SpyVoice(),
                             vad_factory=EnergyVAD), far, config, tracer=Tracer("faults", capacity=1 << 15))
    task = asyncio.create_task(session.run(), name="session")
    return session, wav, far, task


def turn_started(session, i: int) -> bool:
    return len(session.records) > i


async def run_to_end(task, wav) -> None:
    await asyncio.wait_for(task, timeout=120)
    wav.close()


def assert_survived(session, wav, voice: SpyVoice, turn: int, error: str, answered: int | None = None) -> None:
    """Turn `turn` failed with `error` (a regex) and the conversation got over it: turn
    `answered` (default: the next one) got a real answer."""
    rec, log = session.records[turn], list(wav.events_log)
    assert rec.error and re.search(error, rec.error), rec.error
    # the page: a non-fatal error, the turn's latency row with the error, back to listening
    (err_i,) = [i for i, e in enumerate(log) if e["type"] == "error" and e["message"] == rec.error]
    assert log[err_i]["code"] == "reply_failed" and not log[err_i]["fatal"]
    assert not [e for e in log if e["type"] == "error" and e["fatal"]]
    assert [e for e in log[err_i:] if e["type"] == "latency" and e["turn"] == turn and e["error"] == rec.error]
    # the apology: asked of the same voice, sent after the words already out, and played
    assert LLM_APOLOGY in voice.texts
    (final_i,) = [i for i, e in enumerate(log) if e["type"] == "final" and e["turn"] == turn]
    audio = [e for e in log[final_i:err_i] if e["type"] == "audio"]
    said = " ".join(" ".join(e["text"] for e in audio).split())
    assert said.endswith(LLM_APOLOGY), said
    assert rec.heard_text == said[:-len(LLM_APOLOGY)].strip()  # what was heard of the answer itself
    played = {e["id"] for e in log if e["type"] == "played"}
    assert {e["id"] for e in audio} <= played
    last_audio = log.index(audio[-1])
    states = [e["state"] for e in log[last_audio:] if e["type"] == "state"]
    assert states[0] == "listening", (states, [e for e in log[final_i:] if e["type"] not in ("audio", "played")])
    assert rec.voice_to_voice is None or rec.heard_text, "the apology is not the turn's answer"
    # the history keeps what was heard of the answer, never the apology
    assert not [m for m in session.history if "train of thought" in m["content"]]
    if rec.heard_text:
        assert {"role": "assistant", "content": rec.heard_text} in session.history
    # the next turn asked the LLM again, and got a real answer
    nxt = session.records[turn + 1 if answered is None else answered]
    assert nxt.error is None and nxt.reply_text and nxt.llm_first_token and nxt.voice_to_voice is not None
    assert [e for e in log if e["type"] == "bot_done" and e["turn"] == nxt.index and e["text"] == nxt.reply_text]
    assert session.history[-2:] == [{"role": "user", "content": nxt.user_text},
                                    {"role": "assistant", "content": nxt.reply_text}]


# ---- the LLM faults ---------------------------------------------------------------------------
@pytest.mark.models
async def test_a_server_not_started_is_apologized_for_and_the_next_turn_reaches_it(tmp_path, llama_servers):
    server = llama_servers()  # its port is closed: nothing listens there yet
    voice = SpyVoice()
    session, wav, far, task = start_conversation(tmp_path, [STORY, QUESTION], OpenAICompatChat(server.url), voice)
    far.hold()
    assert await await_until(lambda: turn_started(session, 0) and session.records[0].error, timeout=30)
    await server.start()  # the server comes up while the apology plays
    await far.release()
    await run_to_end(task, wav)
    assert_survived(session, wav, voice, 0, r"cannot reach the LLM server")
    assert session.records[0].heard_text == "" and not session.records[0].tokens
    assert session.history[0] == {"role": "user", "content": QUESTION}, "the failed exchange is not kept"


@pytest.mark.models
async def test_a_server_killed_mid_reply_is_apologized_for_and_the_next_turn_reaches_it_again(tmp_path, llama_servers):
    server = await llama_servers().start()
    voice = SpyVoice()
    session, wav, far, task = start_conversation(tmp_path, [STORY, QUESTION], OpenAICompatChat(server.url), voice)
    far.hold()
    assert await await_until(lambda: turn_started(session, 0) and len(session.records[0].tokens) >= 3, timeout=60)
    server.signal(signal.SIGKILL)
    assert await await_until(lambda: session.records[0].error, timeout=10)
    # the client closed its side of the connection the dead server left (no CLOSE_WAIT)
    assert await await_until(lambda: not open_connections(server.port), timeout=3), open_connections(server.port)
    server.proc.wait(10)
    await server.start()  # the same port again
    await far.release()
    await run_to_end(task, wav)
    assert_survived(session, wav, voice, 0, r"stream from .* broke off after \d+ pieces")
    assert session.records[0].tokens, "some of the answer came before the kill"


@pytest.mark.models
async def test_a_stopped_server_times_out_before_and_during_a_reply(tmp_path, llama_servers):
    server = await llama_servers().start()
    server.signal(signal.SIGSTOP)  # it still accepts connections (the kernel does) but answers nothing
    voice = SpyVoice()
    session, wav, _, task = start_conversation(tmp_path, [STORY, STORY, QUESTION],
                                                 OpenAICompatChat(server.url), voice, llm_timeout_s=STALL_S)
    # no first token: the wait is bounded, and the abandoned request's connection is released
    assert await await_until(lambda: turn_started(session, 0) and session.records[0].error, timeout=30)
    assert await await_until(lambda: not open_connections(server.port), timeout=3), open_connections(server.port)
    session.config.llm_timeout_s = HEALTHY_S  # for the replies to come
    # a long answer, so that the server is still generating it when it is stopped (a short one
    # could be all in the socket's buffers by the time the third token is read)
    session.config.max_tokens = 400
    server.signal(signal.SIGCONT)
    # stopped mid-reply: tokens stop coming
    assert await await_until(lambda: turn_started(session, 1) and len(session.records[1].tokens) >= 3, timeout=60)
    # this reply's bound from here on; a wait already begun keeps the bound it began with, so
    # stop the server only once two more tokens came (every wait since began under the new one)
    session.replies.current.config.llm_timeout_s = STALL_S
    n = len(session.records[1].tokens)
    assert await await_until(lambda: len(session.records[1].tokens) >= n + 2, timeout=30)
    server.signal(signal.SIGSTOP)
    session.config.max_tokens, session.config.llm_timeout_s = 24, HEALTHY_S  # the next turns
    assert open_connections(server.port), "the answer streams over an open connection"
    # the tokens already in the socket's buffers are spoken first; then the reply waits, bounded
    assert await await_until(lambda: session.records[1].error, timeout=60), session.records[1].summary()
    events = session.tracer.events()
    last_token = max(e.ts_ns for e in events if e.name == Ev.TOKEN and e.turn == 1)
    (failed,) = [e.ts_ns for e in events if e.name == Ev.REPLY_ERROR and e.turn == 1]
    assert STALL_S <= (failed - last_token) / 1e9 < STALL_S + 1.5, "the stall ended the reply within the bound"
    assert await await_until(lambda: not open_connections(server.port), timeout=3), open_connections(server.port)
    server.signal(signal.SIGCONT)
    await run_to_end(task, wav)
    assert_survived(session, wav, voice, 0, rf"^the LLM gave no first token within {STALL_S:.1f} s$", answered=2)
    assert session.records[1].tokens, "the turn after the stall asked the LLM again"
    assert_survived(session, wav, voice, 1, rf"^the LLM stopped: no token for {STALL_S:.1f} s after \d+ tokens$")
    assert session.records[1].heard_text, "the words said before the stall were heard"


@pytest.mark.models
async def test_a_proxy_cutting_the_connection_mid_answer(tmp_path, llama_servers):
    server = await llama_servers().start()
    proxy = await CuttingProxy(server.port).start()
    try:
        proxy.cut_after = 4
        voice = SpyVoice()
        session, wav, _, task = start_conversation(tmp_path, [STORY, QUESTION], OpenAICompatChat(proxy.url), voice)
        await run_to_end(task, wav)
    finally:
        await proxy.close()
    assert proxy.cuts == 1
    assert_survived(session, wav, voice, 0, r"stream from .* broke off after \d+ pieces")
    assert session.records[0].tokens, "the events before the cut were read"


# ---- a voice that fails on one chunk -------------------------------------------------------------
def _piper():
    from tts.piper_voice import PiperSynthesizer

    return PiperSynthesizer()


def _flite():
    from tts.command_voice import CommandSynthesizer

    return CommandSynthesizer("flite")


@pytest.mark.parametrize("voice, poison", [
    # A lone surrogate: what a JSON string escape ("\ud83d", half an emoji) from an LLM server
    # decodes to. Piper's phonemizer cannot encode it and raises UnicodeEncodeError.
    pytest.param(_piper, "\ud83d", id="piper", marks=pytest.mark.models),
    # A NUL byte: flite is run as a process, and no argument can hold one (ValueError).
    pytest.param(_flite, "\x00", id="flite", marks=pytest.mark.skipif(not flite_available(), reason="no flite")),
])
@pytest.mark.usefixtures("virtual_clock")
async def test_a_voice_failing_on_one_chunk_skips_it_and_the_reply_goes_on(tmp_path, caplog, voice, poison):
    """The real voice, really failing: no wrapper around it. The chunk it cannot speak is
    skipped, logged with its text and traced; the chunks before and after it are spoken."""
    answer = f"Hello there, my friend. The fox {poison} sleeps. It is a quiet day in the wood."
    llm = ScriptedLLM(answer)
    with caplog.at_level(logging.WARNING, logger="duplex.tts"):
        session, wav, _, task = start_conversation(tmp_path, [QUESTION], llm, voice())
        await run_to_end(task, wav)
    (rec,) = list(session.records)
    assert rec.error is None and rec.reply_text == answer and rec.tts_skipped == 1
    (skip,) = [e for e in session.tracer.events() if e.stage == Stage.TTS and e.name == TTS_SKIP]
    assert poison in skip.args["text"] and skip.args["error"]
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == 1 and repr(skip.args["text"]) in warned[0]
    said = " ".join(" ".join(e["text"] for e in wav.events_log if e["type"] == "audio").split())
    assert said.startswith("Hello") and said.endswith("wood."), said  # before and after the bad chunk
    assert "sleeps" not in said and rec.heard_text == said  # the skipped words were not heard
    assert session.history[-1] == {"role": "assistant", "content": rec.heard_text}
    (done,) = [e for e in wav.events_log if e["type"] == "bot_done"]
    assert done["text"] == answer
    assert not [e for e in wav.events_log if e["type"] == "error"]
