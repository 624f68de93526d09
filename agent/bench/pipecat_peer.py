"""`duplex bench pipecat`: the example pipecat bot on duplex's services beside the same pipecat
pipeline on pipecat's own services, same models, same questions, one run.

Both bots are `examples/pipecat_bot.py` (pipecat's WebSocket server transport, Silero VAD,
smart-turn v3, the reply-text message), each in a process of its own on 127.0.0.1:
- duplex: DuplexSTTService (Whisper tiny.en, streaming) -> DuplexLLMService (the GGUF in process,
  llama-cpp-python) -> DuplexTTSService (Piper);
- pipecat: WhisperSTTService (faster-whisper on the same tiny.en files, int8) -> OpenAILLMService
  against `python -m llama_cpp.server` on the same GGUF (a third process) -> PiperTTSService on
  the same voice file (`--stack pipecat`).

A client on pipecat's own WebSocket client transport (protobuf frames) speaks each flite question
at real time, then silence, until the reply has been said. The figure, per question: client-side
voice-to-voice, from the moment the frame holding the question's last speech sample (smoothed
|x| above 1% of full scale, as `duplex bench latency`) goes onto the socket to the moment the
first reply audio frame comes off it; both taken inside the client's frame serializer, at the
wire. The questions alternate between the bots (which one goes first alternates too), so drift
in the machine's load falls on both. One warm-up turn each goes first and is not counted.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agent.bench.latency import QUESTIONS as LATENCY_QUESTIONS
from agent.bench.latency import _flite, _pct, speech_end_offset
from llm import bundled
from transport.audio import INPUT_RATE

RATE = INPUT_RATE  # what the client sends
FRAME_S = 0.02
LEAD_S = 0.5  # silence before each question
QUIET_S = 1.5  # the reply is over: its text came, and no audio for this long
QUESTIONS = LATENCY_QUESTIONS + ["How many days are there in a week?"]
WARMUP = "Hello, can you hear me?"
STACKS = ("duplex", "pipecat")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Turn:
    stack: str
    question: str
    v2v_ms: float | None = None  # None: no reply audio within the timeout
    reply: str = ""
    reply_audio_s: float = 0.0
    warmup: bool = False
    client_late_ms: float = 0.0  # the most a frame of the question went out behind real time


@dataclass
class Result:
    turns: list[Turn] = field(default_factory=list)

    def v2v(self, stack: str) -> list[float]:
        return [t.v2v_ms for t in self.turns if t.stack == stack and not t.warmup and t.v2v_ms is not None]

    def summary(self) -> dict:
        out = {}
        for s in STACKS:
            v = self.v2v(s)
            asked = sum(t.stack == s and not t.warmup for t in self.turns)
            out[s] = {"answered": len(v), "asked": asked, "p50_ms": _pct(v, 50), "p90_ms": _pct(v, 90)}
        d, p = out["duplex"], out["pipecat"]
        for q in ("p50_ms", "p90_ms"):
            out[f"ratio_{q[:3]}"] = round(p[q] / d[q], 2) if d[q] and p[q] else None  # pipecat / duplex
        return out


# ---- the processes ------------------------------------------------------------------------------
class Processes:
    """The child processes of the run, logging to files (a pipe would fill and stall them);
    all stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        log.close()  # the child holds its own descriptor
        self.procs[name] = proc
        return proc

    def log(self, name: str, tail: int = 3000) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-tail:]

    def check(self, name: str) -> None:
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited with {self.procs[name].returncode}:\n{self.log(name)}")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(procs: Processes, name: str, ready, timeout: float) -> None:
    """Poll `ready()` (bounded) while the process lives."""
    deadline = time.monotonic() + timeout
    while not ready():
        procs.check(name)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready after {timeout:.0f} s:\n{procs.log(name)}")
        time.sleep(0.3)


def _http_ok(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200
    return False


def start_all(procs: Processes, llm: str, timeout: float, turn_stop_timeout: float = 20.0) -> dict[str, str]:
    """The llama.cpp server and both bots, started together; their ws:// URLs once all serve."""
    import importlib.util

    from llm.bundled import resolve

    if importlib.util.find_spec("sse_starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise RuntimeError("llama.cpp's server is not installed: pip install 'llama-cpp-python[server]'")
    if not (ROOT / "examples" / "pipecat_bot.py").exists():
        raise RuntimeError(f"examples/pipecat_bot.py is not in {ROOT}: run from a checkout of duplex")
    gguf = resolve(llm)
    llm_port, ports = _free_port(), {s: _free_port() for s in STACKS}
    procs.start("llama-server", [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                                 "--host", "127.0.0.1", "--port", str(llm_port), "--n_ctx", "2048",
                                 # as duplex's LlamaCppChat: a thread per core
                                 "--n_threads", str(os.cpu_count() or 1), "--verbose", "False"])
    # a late transcript (a busy CPU) is waited for rather than answered as an empty turn
    bot = [sys.executable, "-m", "examples.pipecat_bot", "--host", "127.0.0.1", "--llm", llm,
           "--turn-stop-timeout", str(turn_stop_timeout)]
    procs.start("duplex", bot + ["--port", str(ports["duplex"])])
    procs.start("pipecat", bot + ["--port", str(ports["pipecat"]), "--stack", "pipecat",
                                  "--llm-url", f"http://127.0.0.1:{llm_port}/v1"])
    wait_ready(procs, "llama-server", lambda: _http_ok(f"http://127.0.0.1:{llm_port}/v1/models"), timeout)
    for s in STACKS:
        wait_ready(procs, s, lambda s=s: "pipecat bot: serving on" in procs.log(s, 100_000), timeout)
    return {s: f"ws://127.0.0.1:{ports[s]}" for s in STACKS}


# ---- the client ---------------------------------------------------------------------------------
def _wire_serializer():
    """pipecat's protobuf serializer, noting when audio goes onto the socket and comes off it."""
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        InputTransportMessageFrame,
        OutputAudioRawFrame,
    )
    from pipecat.serializers.protobuf import ProtobufFrameSerializer

    class WireClock(ProtobufFrameSerializer):
        def __init__(self):
            super().__init__()
            self.samples_sent = 0
            self.mark: int | None = None  # sample count to time
            self.mark_t: float | None = None
            self.audio_in: list[tuple[float, bytes]] = []  # (arrival, PCM16)
            self.out_rate = 0
            self.replies: list[tuple[float, str]] = []

        async def serialize(self, frame):
            payload = await super().serialize(frame)
            if isinstance(frame, OutputAudioRawFrame):  # sent right after this returns
                self.samples_sent += len(frame.audio) // 2
                if self.mark is not None and self.mark_t is None and self.samples_sent >= self.mark:
                    self.mark_t = time.perf_counter()
            return payload

        async def deserialize(self, data):
            frame = await super().deserialize(data)
            t = time.perf_counter()
            if isinstance(frame, InputAudioRawFrame):
                self.audio_in.append((t, frame.audio))
                self.out_rate = frame.sample_rate
            elif isinstance(frame, InputTransportMessageFrame):
                msg = frame.message
                with contextlib.suppress(ValueError, TypeError):
                    msg = json.loads(msg) if isinstance(msg, (str, bytes)) else msg
                if isinstance(msg, dict) and msg.get("type") == "bot-reply":
                    self.replies.append((t, str(msg.get("text", ""))))
            return frame

    return WireClock()


class Client:
    """One connection to a bot over pipecat's WebsocketClientTransport, in a pipeline of its own."""

    def __init__(self, url: str):
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.transports.websocket.client import (
            WebsocketClientParams,
            WebsocketClientTransport,
        )

        self.wire = _wire_serializer()
        self.connected = asyncio.Event()
        # raw PCM frames: the client transport's default wraps each chunk in a WAV header, which
        # the bots' server transport plays as 22 samples of noise every 40 ms; its writer's own
        # pacing (half a chunk) stays under our 20 ms frames
        self.transport = WebsocketClientTransport(url, WebsocketClientParams(
            audio_out_enabled=True, audio_in_enabled=False, add_wav_header=False,
            audio_out_10ms_chunks=round(FRAME_S * 100), serializer=self.wire))

        @self.transport.event_handler("on_connected")
        async def _connected(transport, websocket):
            self.connected.set()

        self.worker = PipelineWorker(Pipeline([self.transport.input(), self.transport.output()]),
                                     params=PipelineParams(audio_out_sample_rate=RATE), idle_timeout_secs=None,
                                     # the bots speak RTVI; a second RTVI end here would answer each of
                                     # their messages with an error message, and they it, without end
                                     enable_rtvi=False)
        self._task: asyncio.Task | None = None
        self.last_reply_audio = b""  # the last answer's audio as it came off the socket (PCM16)
        self.late_ms = 0.0

    async def start(self, timeout: float = 30.0) -> None:
        from pipecat.workers.runner import WorkerRunner

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        self._task = asyncio.create_task(runner.run())
        async with asyncio.timeout(timeout):
            await self.connected.wait()

    async def close(self) -> None:
        from pipecat.frames.frames import EndFrame

        if self._task is None:
            return
        with contextlib.suppress(Exception):
            await self.worker.queue_frame(EndFrame())
            async with asyncio.timeout(15):
                await asyncio.shield(self._task)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def ask(self, pcm: np.ndarray, speech_end_s: float, reply_timeout: float) -> tuple[float | None, str, float]:
        """Speak `pcm` at real time, then silence until the reply has been said (bounded);
        (voice-to-voice ms or None, the reply's text, seconds of reply audio). `self.late_ms`:
        how far the question's frames fell behind real time (a starved client)."""
        from pipecat.frames.frames import OutputAudioRawFrame

        wire = self.wire
        wire.mark, wire.mark_t = wire.samples_sent + round(speech_end_s * RATE), None
        audio_from, replies_from = len(wire.audio_in), len(wire.replies)
        x = (np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        step = int(RATE * FRAME_S)
        silence = bytes(2 * step)
        t0 = time.perf_counter()
        deadline = t0 + pcm.size / RATE + reply_timeout
        k = 0
        self.late_ms = 0.0
        while time.perf_counter() < deadline:
            i = k * step
            if i < x.size:
                self.late_ms = max(self.late_ms, (time.perf_counter() - (t0 + k * FRAME_S)) * 1000.0)
            chunk = x[i:i + step].tobytes() if i < x.size else silence
            # straight to the transport's writer: the output transport's media sender plays a
            # bot (it pads with silence and drops a part-filled chunk when it thinks the bot
            # stopped, as a late frame on a busy CPU makes it think), not a microphone
            await self.transport.output().write_audio_frame(OutputAudioRawFrame(chunk.ljust(2 * step, b"\0"), RATE, 1))
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * FRAME_S - time.perf_counter()))  # real time
            got = wire.audio_in[audio_from:]
            if (wire.mark_t is not None and len(wire.replies) > replies_from and got
                    and time.perf_counter() - got[-1][0] > QUIET_S):
                break
        reply = " ".join(text for _, text in wire.replies[replies_from:])
        after = [(t, a) for t, a in wire.audio_in[audio_from:] if wire.mark_t is not None and t >= wire.mark_t]
        self.last_reply_audio = b"".join(a for _, a in after)
        if not after:
            return None, reply, 0.0
        seconds = sum(len(a) for _, a in after) / 2 / max(wire.out_rate, 1)
        return (after[0][0] - wire.mark_t) * 1000.0, reply, seconds


# ---- the run ------------------------------------------------------------------------------------
def make_questions(texts: list[str], work_dir: Path, prefix: str = "q") -> list[tuple[str, np.ndarray, float]]:
    """(text, 16 kHz audio with LEAD_S of silence first, offset of its end of speech)."""
    if shutil.which("flite") is None:
        raise RuntimeError("flite is not installed (apt-get install flite)")
    out = []
    for i, text in enumerate(texts):
        speech = _flite(text, work_dir / f"{prefix}{i}.wav")
        pcm = np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), speech])
        end = speech_end_offset(pcm, RATE)
        if end is None:
            raise RuntimeError(f"flite said nothing for {text!r}")
        out.append((text, pcm, end))
    return out


async def drive(urls: dict[str, str], questions, warmup, reply_timeout: float, progress=print) -> Result:
    clients = {s: Client(urls[s]) for s in STACKS}
    result = Result()
    try:
        for c in clients.values():
            await c.start()
        schedule = [(s, q, True) for s in STACKS for q in warmup]
        for i, q in enumerate(questions):
            order = STACKS if i % 2 == 0 else STACKS[::-1]
            schedule += [(s, q, False) for s in order]
        for stack, (text, pcm, end), is_warmup in schedule:
            v2v, reply, seconds = await clients[stack].ask(pcm, end, reply_timeout)
            late = clients[stack].late_ms
            turn = Turn(stack, text, None if v2v is None else round(v2v, 1), reply, round(seconds, 2), is_warmup,
                        round(late, 1))
            result.turns.append(turn)
            shown = "no reply" if v2v is None else f"{v2v:7.0f} ms"
            progress(f"  {'warm-up ' if is_warmup else 'question'} {stack:8s} {shown}  (client late {late:4.0f} ms)  "
                     f"{text!r} -> {reply[:70]!r}")
    finally:
        for c in clients.values():
            await c.close()
    return result


def report(result: Result, out=print) -> dict:
    s = result.summary()
    out("\nclient-side voice-to-voice (end of the question's speech -> first reply audio frame), ms:")
    for stack in STACKS:
        r = s[stack]
        out(f"  {stack:8s} p50 {r['p50_ms']}  p90 {r['p90_ms']}  ({r['answered']}/{r['asked']} answered)")
    out(f"  pipecat / duplex: p50 x{s['ratio_p50']}, p90 x{s['ratio_p90']}")
    late = max((t.client_late_ms for t in result.turns), default=0.0)
    if late > 100:
        out(f"  note: the client fell up to {late:.0f} ms behind real time (a busy CPU): figures are inflated")
    return s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplex bench pipecat", description=__doc__.split("\n\n")[0])
    p.add_argument("--llm", default=bundled.DEFAULT, help="a bundled GGUF name or .gguf path, for both bots")
    p.add_argument("--questions", type=int, default=len(QUESTIONS),
                   help=f"ask the first N questions (default all {len(QUESTIONS)})")
    p.add_argument("--warmup", type=int, default=1, choices=(0, 1), help="a warm-up turn per bot first (default 1)")
    p.add_argument("--reply-timeout", type=float, default=60.0, help="give up on a reply after this long (s)")
    p.add_argument("--start-timeout", type=float, default=240.0, help="seconds for the servers to load")
    p.add_argument("--json", help="write the turns and the summary here")
    p.add_argument("--keep-logs", help="keep the servers' logs in this directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    texts = QUESTIONS[:max(1, args.questions)]
    with tempfile.TemporaryDirectory(prefix="duplex-bench-pipecat-") as tmp:
        log_dir = Path(args.keep_logs) if args.keep_logs else Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        questions = make_questions(texts, Path(tmp))
        warmup = make_questions([WARMUP], Path(tmp), prefix="w") if args.warmup else []
        procs = Processes(log_dir)
        try:
            t = time.perf_counter()
            urls = start_all(procs, args.llm, args.start_timeout)
            print(f"llama.cpp server and both bots serving after {time.perf_counter() - t:.0f} s; "
                  f"{len(texts)} questions each, alternating")
            result = asyncio.run(drive(urls, questions, warmup, args.reply_timeout))
        finally:
            procs.stop_all()
    summary = report(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "turns": [asdict(t) for t in result.turns]},
                                              indent=2))
    return 0 if all(summary[s]["answered"] for s in STACKS) else 1


if __name__ == "__main__":
    sys.exit(main())
