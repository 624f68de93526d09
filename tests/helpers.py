"""Shared test helpers: synthetic speech with flite, WAV building, a free port."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import soundfile as sf

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DEV = SHARED / "speech" / "dev"


def dev_reference(name: str) -> str:
    """The reference transcript of a dev clip (../shared/speech/dev/transcripts.tsv)."""
    for line in (DEV / "transcripts.tsv").read_text().splitlines():
        clip, _, text = line.partition("\t")
        if clip == name:
            return text
    raise KeyError(name)


class StreamEvents:
    """Reads a recognizer stream's events in a task, as a conversation does; a failure of the
    stream is kept in `error`."""

    def __init__(self, stream):
        import asyncio

        self.events: list = []
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run(stream))

    async def _run(self, stream):
        from asr.base import RecognizerFailed

        try:
            async for ev in stream.events():
                self.events.append(ev)
        except RecognizerFailed as e:
            self.error = e

    def words(self, events=None) -> list[tuple[str, float, float]]:
        from asr.base import WordEvent

        return [(e.word.text, e.word.start, e.word.end) for e in (self.events if events is None else events)
                if isinstance(e, WordEvent)]

    def text(self, events=None) -> str:
        return " ".join(w for w, _, _ in self.words(events))


def flite_available() -> bool:
    return shutil.which("flite") is not None


def say(text: str, path: Path, rate: int = 16000, voice: str = "slt") -> np.ndarray:
    """Speak `text` with flite (`voice`) into a 16-bit WAV at `rate`; return float32 samples."""
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
    data, r = sf.read(raw, dtype="float32")
    if r != rate:
        from transport.audio import resample

        data = resample(data, r, rate)
    sf.write(path, data, rate, subtype="PCM_16")
    return data


async def page_conversation(url: str, audio: np.ndarray, rate: int, log: list[dict] | None = None,
                            hold=None, timeout: float = 30.0) -> list[dict]:
    """A browser-protocol client (what the page does; transport.web.client.converse): hello, the
    audio as PCM16 in 20 ms frames at real time, then the server's JSON events into `log` until
    the reply is done or an error came; stays connected until `hold` (an asyncio.Event) is set,
    if given."""
    from transport.web.client import converse

    log = [] if log is None else log
    await converse(url, audio, rate, events=log, hold=hold, reply_timeout=timeout)
    return log


def kernel_socket_buffer_bytes() -> int:
    """The most the kernel buffers in one TCP connection's send and receive queues (max settings)."""
    total = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            total += int(f.read().split()[2])
    return total


def silence(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.float32)


def speech_onset_s(audio: np.ndarray, rate: int = 16000, floor_db: float = -40.0) -> float:
    """Where speech starts in `audio` (s): the first 10 ms window louder than `floor_db` dBFS
    (flite's files start with a little silence)."""
    n = rate // 100
    frames = audio[:audio.size // n * n].reshape(-1, n).astype(np.float64)
    loud = np.flatnonzero(10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-12) > floor_db)
    return float(loud[0] * n / rate) if loud.size else 0.0


def report_figure(name: str, **figures) -> None:
    """Print a measured figure and append it to $DUPLEX_FIGURES (JSON lines), for closing notes
    and benchmarks; tests assert properties, never these timings."""
    import json

    line = json.dumps({"figure": name, **figures})
    print("figure:", line)
    if path := os.environ.get("DUPLEX_FIGURES"):
        with open(path, "a") as f:
            f.write(line + "\n")


CAPITAL_QUESTION = "What is the capital of France?"


# where the answer's first word sits in the listener's window: see `hear_answer`
LISTEN_LEADS_S = (0.0, 0.25, 0.5)


def hear_answer(audio: np.ndarray, rate: int, question: str) -> list[str]:
    """What the caller who asked `question` hears in the bot's audio (float32), listened to three
    times: Whisper tiny.en, beam 5, on its 30 s window, told the question as its initial prompt, as
    the person who asked it knows it, with the audio starting 0, 0.25 and 0.5 s into the window.
    tiny.en's slips on a clean answer move with where its first word sits ("France is Paris" heard
    as "France's pairs" at one lead, right at another), while a lost word, a gap or other audio is
    misheard at every lead; untold, it mishears a one-word answer too often for a test's bar; told,
    it never hears another answer, silence or noise as the expected one (docs/testing.md, "Hearing
    the bot's answer")."""
    from asr.whisper import WhisperRecognizer
    from transport.audio import resample

    model = WhisperRecognizer.load().model
    x = resample(audio, rate, 16000)
    heard = []
    for lead in LISTEN_LEADS_S:
        segments, _ = model.transcribe(
            np.concatenate([np.zeros(int(lead * 16000), np.float32), x]), language="en", beam_size=5,
            temperature=0.0, initial_prompt=question, condition_on_previous_text=False, vad_filter=False,
            without_timestamps=True)
        heard.append(" ".join(s.text.strip() for s in segments).strip())
    return heard


def closest(heard: list[str], reply: str) -> str:
    """Of the listener's hearings, the one nearest the reply in letters."""
    from asr.wer import cer

    return min(heard, key=lambda h: cer([reply], [h]))


def is_word_prefix(heard: str, reply: str, strict: bool = False) -> bool:
    """`heard` is the reply's first words (with `strict`, fewer than all of them): what a cut reply
    leaves in the context."""
    h, r = heard.split(), reply.split()
    return r[:len(h)] == h and (not strict or len(h) < len(r))


# a request that runs long, for checking that closing a chat stream early stops it
LONG_STORY = [{"role": "system", "content": "You write very long stories."},
              {"role": "user", "content": "Tell me a very long story about a dragon."}]


async def read_then_close(stream, n: int) -> int:
    """Read `n` pieces of a chat model's stream, then close it; return how many were read."""
    import contextlib

    seen = 0
    async with contextlib.aclosing(stream) as pieces:
        async for _ in pieces:
            seen += 1
            if seen == n:
                break
    return seen


async def cancel_task_after(stream, n: int) -> list:
    """Consume a chat model's stream in a task, cancel the task once `n` pieces have come, and
    return the list the task appends to (a piece that arrives after the cancel would show in it)."""
    import asyncio
    import contextlib

    produced: list = []

    async def consume():
        async for piece in stream:
            produced.append(piece)

    task = asyncio.create_task(consume())
    while len(produced) < n:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return produced


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float, every: float = 0.05) -> bool:
    """Poll `condition()` until it is true or `timeout` seconds have passed; its last value."""
    deadline = time.time() + timeout
    while not (met := condition()) and time.time() < deadline:
        time.sleep(every)
    return bool(met)


async def await_until(condition, timeout: float = 30.0, every: float = 0.01) -> bool:
    """`wait_until` for a test on the event loop: polls without blocking it."""
    import asyncio

    deadline = time.time() + timeout
    while not (met := condition()) and time.time() < deadline:
        await asyncio.sleep(every)
    return bool(met)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(url)


@contextlib.contextmanager
def duplex_asr_serve(*args: str, timeout: float = 120.0):
    """`duplex asr-serve --port 0 *args` in a subprocess; yields its ws:// URL once it serves."""
    import re

    cmd = [sys.executable, "-m", "agent.serving.cli", "asr-serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline, url = time.time() + timeout, None
        while url is None and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"asr-serve exited with {proc.wait()} before serving")
            if m := re.search(r"asr-serve: .* on (ws://\S+)", line):
                url = m.group(1)
        assert url, "asr-serve did not say where it serves"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def duplex_serve_process(*args: str):
    """`duplex serve --port PORT *args` in a subprocess, up and answering HTTP; yields (PORT,
    the process) and prints the end of its output when it stops (SIGTERM, if still running)."""
    port = free_port()
    cmd = [sys.executable, "-m", "agent.serving.cli", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            out, _ = proc.communicate(timeout=40)  # SIGTERM drains: up to --drain-timeout
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        print(out[-4000:])


@contextlib.contextmanager
def duplex_serve(*args: str):
    """`duplex serve` as `duplex_serve_process`; yields PORT."""
    with duplex_serve_process(*args) as (port, _):
        yield port


ENGINE_FRAME = 1920  # samples of one engine frame at the tiny engines' 24 kHz


def engine_audio(seed: int, frames: int) -> np.ndarray:
    """`frames` engine frames of a seeded tone in noise: audio the tiny random engines step on."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * ENGINE_FRAME) / 24000
    tone = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t)
    return (tone + 0.2 * rng.standard_normal(t.size)).astype(np.float32)


def self_signed_cert(directory: Path):
    """A certificate for 127.0.0.1 and its key, made with openssl in `directory`, and an SSL
    context that trusts it: (cert path, key path, client context)."""
    import ssl

    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key, ssl.create_default_context(cafile=str(cert))
