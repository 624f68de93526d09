"""Bad input over the real browser WebSocket endpoint, with the real default models (SmolLM2 for
speed). The server must answer each with a clear error and keep the session, or clean up fully."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
from websockets.sync.client import connect

from helpers import free_port, say, silence, wait_until

pytestmark = pytest.mark.models


class ServerThread:
    def __init__(self, models):
        from agent.conversation.session import Session, SessionConfig
        from transport.web.server import run_server

        self.port = free_port()
        self.sessions: list[Session] = []
        self.finished: list[Session] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def handler(transport):
            session = Session(models, transport, SessionConfig(), session_id=f"t{len(self.sessions)}")
            self.sessions.append(session)
            try:
                await session.run()
            finally:
                self.finished.append(session)

        async def main():
            started = asyncio.Event()
            task = asyncio.create_task(run_server(handler, "127.0.0.1", self.port, models.tts.sample_rate, started))
            await started.wait()
            ready.set()
            await task

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        assert ready.wait(30)

    def tasks(self) -> set[str]:
        fut = asyncio.run_coroutine_threadsafe(_task_names(), self.loop)
        return fut.result(5)


async def _task_names():
    return {t.get_name() for t in asyncio.all_tasks() if not t.done()}


@pytest.fixture(scope="module")
def server():
    from agent.conversation.models import ModelChoice, load_models

    return ServerThread(load_models(ModelChoice(llm="smollm2-135m")))


@pytest.fixture(scope="module")
def question(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    return np.concatenate([silence(0.3), say("What is the capital of France?", d / "q.wav"), silence(1.2)])


def recv_until(ws, pred, timeout=30.0):
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        try:
            msg = ws.recv(timeout=max(0.01, deadline - time.time()))
        except TimeoutError:
            break
        if isinstance(msg, bytes):
            seen.append({"type": "<audio>"})
            continue
        ev = json.loads(msg)
        seen.append(ev)
        if pred(ev):
            return ev, seen
    raise AssertionError(f"condition not met; saw {[e.get('type') for e in seen][-30:]}")


def send_pcm(ws, x: np.ndarray, rate: int, speed: float = 4.0):
    n = rate // 50
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2")
    for i in range(0, pcm.size, n):
        ws.send(pcm[i:i + n].tobytes())
        time.sleep(0.02 / speed)


def url(server):
    return f"ws://127.0.0.1:{server.port}/ws"


def test_malformed_and_unknown_messages_get_errors_and_the_session_continues(server):
    with connect(url(server)) as ws:
        ws.send("{this is not json")
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "bad_json"
        ws.send(json.dumps({"type": "teleport"}))
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "unknown_type" and "teleport" in ev["message"]
        ws.send(json.dumps(["hello"]))
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "bad_message"
        ws.send(b"\x01\x02\x03")
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "bad_audio"
        ws.send(json.dumps({"type": "ping", "t": 1.5}))
        ev, _ = recv_until(ws, lambda e: e["type"] == "pong")
        assert ev["t"] == 1.5


def test_oversized_frame_gets_a_clear_error(server):
    from websockets.exceptions import ConnectionClosed

    from transport.web.protocol import MAX_AUDIO_BYTES
    from transport.web.server import MAX_FRAME_BYTES

    over_protocol = MAX_AUDIO_BYTES + 12_000  # over the protocol's limit, under the frame limit
    assert over_protocol < MAX_FRAME_BYTES
    with connect(url(server), max_size=None) as ws:
        ws.send(b"\x00" * over_protocol)
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "frame_too_large" and str(over_protocol) in ev["message"]
        ws.send(json.dumps({"type": "ping", "t": 2}))
        recv_until(ws, lambda e: e["type"] == "pong")
        ws.send(b"\x00" * (MAX_FRAME_BYTES + 1))  # over the frame limit: the connection is closed
        with pytest.raises(ConnectionClosed):
            recv_until(ws, lambda e: False, timeout=10)
        assert ws.protocol.close_code == 1009


def test_declared_sample_rate_is_resampled_or_rejected(server, question):
    from transport.audio import resample

    with connect(url(server)) as ws:
        ws.send(json.dumps({"type": "hello", "sample_rate": 1000}))
        ev, _ = recv_until(ws, lambda e: e["type"] == "error")
        assert ev["code"] == "bad_sample_rate" and "8000" in ev["message"]
        ws.send(json.dumps({"type": "hello", "sample_rate": 44100}))
        ev, _ = recv_until(ws, lambda e: e["type"] == "ready")
        assert ev["input_sample_rate"] == 44100
        send_pcm(ws, resample(question, 16000, 44100), 44100)
        ev, _ = recv_until(ws, lambda e: e["type"] == "final", timeout=60)
        assert "capital" in ev["text"].lower() and "france" in ev["text"].lower(), ev["text"]


def wait_ended(server, sessions, timeout=15.0) -> None:
    """Wait until every session in `sessions` has ended (its `run()` returned)."""
    def running() -> list[str]:
        return [s.session_id for s in sessions if s not in server.finished]

    assert wait_until(lambda: not running(), timeout), \
        f"sessions still running {timeout} s after their page closed: {running()}"


def test_disconnect_mid_turn_cancels_everything(server, question):
    # the earlier tests' pages have closed: their sessions end (a reply cut mid-token finishes that
    # token first), so that the task check below sees only this session's leftovers
    wait_ended(server, list(server.sessions))
    first = len(server.sessions)
    with connect(url(server)) as ws:
        ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))
        send_pcm(ws, question, 16000)
        recv_until(ws, lambda e: e["type"] == "bot_text", timeout=60)  # the reply is under way
    assert len(server.sessions) == first + 1
    session = server.sessions[first]
    wait_ended(server, [session])
    assert session.replies.current is None or not session.replies.current.running
    time.sleep(0.3)
    leftover = {n for n in server.tasks() if n.startswith(("reply-", "asr"))}
    assert not leftover, f"tasks outlived their session: {leftover}"
    # the models are free again: a new session gets a full reply
    with connect(url(server)) as ws:
        ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))
        send_pcm(ws, question, 16000)
        ev, _ = recv_until(ws, lambda e: e["type"] == "bot_done", timeout=60)
        assert ev["text"].strip()


def test_two_sessions_at_once_keep_to_themselves(server, question, tmp_path):
    """Two pages talking at the same moment share the models but nothing else: each hears its
    own question back, gets its own answer, and keeps its own history."""
    other = np.concatenate([silence(0.3), say("How many legs does a spider have?", tmp_path / "q2.wav"), silence(1.2)])
    results: dict[str, tuple] = {}
    first = len(server.sessions)

    def converse(name: str, audio: np.ndarray) -> None:
        with connect(url(server)) as ws:
            ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))
            send_pcm(ws, audio, 16000, speed=1.0)  # both at once, at real time
            final, _ = recv_until(ws, lambda e: e["type"] == "final", timeout=60)
            done, _ = recv_until(ws, lambda e: e["type"] == "bot_done", timeout=60)
            results[name] = (final["text"], done["text"])

    threads = [threading.Thread(target=converse, args=a) for a in (("france", question), ("spider", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(results) == {"france", "spider"}, results
    assert "france" in results["france"][0].lower() and "spider" not in results["france"][0].lower()
    assert "spider" in results["spider"][0].lower() and "france" not in results["spider"][0].lower()
    assert all(reply.strip() for _, reply in results.values())
    histories = [" ".join(m["content"] for m in s.history if m["role"] == "user")
                 for s in server.sessions[first:first + 2]]
    assert sorted("spider" in h.lower() for h in histories) == [False, True], histories
    assert sorted("france" in h.lower() for h in histories) == [False, True], histories
