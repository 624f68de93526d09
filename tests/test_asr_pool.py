"""A recognizer pool behind one name (issue 21, part 1): `--asr ws://NAME:PORT` where NAME resolves
to several replicas, as a Kubernetes headless Service does.

Two real `duplex asr-serve` processes (the embedded Whisper, 1 slot each) bound to 127.0.0.2
and 127.0.0.3 (both loopback on Linux) on the same port; the name is mapped to them by the
RemoteRecognizer's resolver seam, so /etc/hosts is not touched. Shown: streams spread over
both; a full replica (moshi's "no free slot" error) or one that does not answer (SIGSTOP) is
skipped; a replica SIGKILLed mid-stream is replaced by the other, the gap is counted, and the
words said after it are recognised. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import pytest
import soundfile as sf
import soxr
from prometheus_client.parser import text_string_to_metric_families

from asr.base import Flushed, Gap, RecognizerUnavailable, WordEvent
from asr.remote import RemoteRecognizer, getaddrinfo_resolve
from asr.wer import wer

sys.path.insert(0, os.path.dirname(__file__))
from helpers import DEV, StreamEvents, await_until, dev_reference

pytestmark = pytest.mark.models

SR = 24000
ADDRESSES = ["127.0.0.2", "127.0.0.3"]
NAME = "asr-pool.test"  # resolved by the test's resolver only
TIMEOUT = 60.0


def common_free_port(hosts: list[str]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts[1:]:
                with socket.socket() as t:
                    t.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every address")


class Replica:
    """`duplex asr-serve --host ADDRESS --port PORT --slots 1`, its output in a file (never a full pipe)."""

    def __init__(self, address: str, port: int, *args: str):
        self.address, self.port = address, port
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"asr-{address}-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-m", "agent.serving.cli", "asr-serve", "--host", address, "--port", str(port),
               "--slots", "1", "--drain-timeout", "2", *args]
        self.proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        with open(self.log.name) as f:
            return f.read()

    def wait_serving(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(r"asr-serve: .* on ws://", self.output()):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"asr-serve exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"asr-serve on {self.address} did not start")

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.address}:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def served(self) -> float:
        _, text = self.http("/metrics")
        for family in text_string_to_metric_families(text):
            if family.name == "duplex_asr_streams":
                return sum(s.value for s in family.samples
                           if s.name == "duplex_asr_streams_total" and s.labels.get("result") == "served")
        raise AssertionError("no duplex_asr_streams in /metrics")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped one could not take the SIGTERM
            self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture
def pool():
    port = common_free_port(ADDRESSES)
    replicas = [Replica(a, port) for a in ADDRESSES]
    try:
        for r in replicas:
            r.wait_serving()
        yield port, {r.address: r for r in replicas}
    finally:
        for r in replicas:
            r.stop()


class FakeDns:
    """NAME -> the replicas' addresses; anything else from the real resolver. Counts look-ups."""

    def __init__(self, addresses: list[str]):
        self.addresses = list(addresses)
        self.calls = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        if host != NAME:
            return await getaddrinfo_resolve(host, port)
        self.calls += 1
        return list(self.addresses)


def clip(name: str) -> np.ndarray:
    data, rate = sf.read(DEV / name, dtype="float32")
    return soxr.resample(data, rate, SR, quality="HQ").astype(np.float32)


async def feed(stream, pcm: np.ndarray, chunk: int = 1920) -> None:
    for i in range(0, pcm.size, chunk):
        await stream.feed(pcm[i:i + chunk])


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


# ---- tests -------------------------------------------------------------------------------------
async def test_a_name_with_two_addresses_spreads_streams_over_both_replicas(pool):
    port, replicas = pool
    dns = FakeDns(ADDRESSES)
    rec = RemoteRecognizer(f"ws://{NAME}:{port}", resolve=dns, open_timeout_s=5)
    used = []
    for _ in range(10):
        stream = await rec.open_stream()
        used.append(stream.link.replica.address)
        assert stream.link.url.startswith(f"ws://{NAME}:{port}/api/asr-streaming")
        await stream.close()
        # the replica frees its slot once it sees the close
        r = replicas[used[-1]]
        assert await await_until(lambda r=r: r.http("/readyz")[0] == 200, timeout=10, every=0.05)
    assert dns.calls == 10, "the name is resolved again for every new stream"
    assert set(used) == set(ADDRESSES), used
    assert rec.stats.opened == 10
    served = {a: r.served() for a, r in replicas.items()}
    assert all(n >= 1 for n in served.values()) and sum(served.values()) == 10, served
    # DNS changes are followed: a replica gone from the records gets no more streams
    dns.addresses = ADDRESSES[1:]
    for _ in range(3):
        stream = await rec.open_stream()
        assert stream.link.replica.address == ADDRESSES[1]
        await stream.close()
        assert await await_until(lambda: replicas[ADDRESSES[1]].http("/readyz")[0] == 200, timeout=10)


async def test_a_full_or_silent_replica_is_skipped_and_all_full_is_refused_with_reasons(pool):
    port, replicas = pool
    rec = RemoteRecognizer(f"ws://{NAME}:{port}", resolve=FakeDns(ADDRESSES), open_timeout_s=1.5)
    first = await rec.open_stream()
    held = first.link.replica.address
    other = next(a for a in ADDRESSES if a != held)
    status, body = replicas[held].http("/readyz")
    assert status == 503 and "no free slot" in body
    for _ in range(3):  # whatever the random order, the full one is passed over
        refusals = rec.stats.refusals
        second = await rec.open_stream()
        assert second.link.replica.address == other
        await second.close()
        assert await await_until(lambda: replicas[other].http("/readyz")[0] == 200, timeout=10)
        assert rec.stats.refusals - refusals in (0, 1)
    second = await rec.open_stream()
    with pytest.raises(RecognizerUnavailable) as refused:
        await rec.open_stream()
    message = str(refused.value)
    assert all(f"[{a}]" in message for a in ADDRESSES) and message.count("no free slot") == 2, message
    await second.close()
    # a replica that does not answer at all (stopped): skipped after the open timeout
    os.kill(replicas[other].proc.pid, signal.SIGSTOP)
    try:
        await first.close()
        assert await await_until(lambda: replicas[held].http("/readyz")[0] == 200, timeout=10)
        for _ in range(2):
            t0 = time.monotonic()
            stream = await rec.open_stream()
            assert stream.link.replica.address == held and time.monotonic() - t0 < 10
            await stream.close()
            assert await await_until(lambda: replicas[held].http("/readyz")[0] == 200, timeout=10)
    finally:
        os.kill(replicas[other].proc.pid, signal.SIGCONT)


async def test_a_replica_killed_mid_stream_hands_the_stream_to_the_other_and_later_words_are_heard(pool):
    port, replicas = pool
    rec = RemoteRecognizer(f"ws://{NAME}:{port}", resolve=FakeDns(ADDRESSES), reconnect_timeout_s=20)
    stream = await rec.open_stream()
    events = StreamEvents(stream)
    first, cut, later = (clip(n) for n in ("goforward.wav", "cards_005.wav", "sense_and_sensibility_01_austen_64kb-0880.wav"))
    victim = stream.link.replica.address
    survivor = next(a for a in ADDRESSES if a != victim)

    await feed(stream, np.concatenate([first, silence(1.0)]))
    await asyncio.wait_for(stream.flush(stream.fed_samples / SR), TIMEOUT)
    assert wer([dev_reference("goforward.wav")], [events.text()]) <= 0.25, events.text()

    await feed(stream, cut[:cut.size // 2])  # mid-utterance
    replicas[victim].proc.kill()  # SIGKILL: no close frame, no drain
    replicas[victim].proc.wait(timeout=10)
    await feed(stream, np.concatenate([cut[cut.size // 2:], silence(1.0)]))
    assert await await_until(lambda: stream.gaps == 1, timeout=30)
    assert stream.link.replica.address == survivor
    later_s = stream.fed_samples / SR
    await feed(stream, np.concatenate([later, silence(1.0)]))
    end_s = stream.fed_samples / SR
    await asyncio.wait_for(stream.flush(end_s), TIMEOUT)
    await stream.close()
    await asyncio.wait_for(events.task, TIMEOUT)

    assert events.error is None
    gaps = [e for e in events.events if isinstance(e, Gap)]
    assert len(gaps) == 1 and gaps[0].reason
    assert first.size / SR <= gaps[0].start_s <= gaps[0].end_s <= end_s
    assert rec.stats.reconnects == 1 and rec.stats.gaps == 1
    assert rec.stats.gap_seconds == pytest.approx(gaps[0].end_s - gaps[0].start_s)
    heard_later = events.text([e for e in events.events if isinstance(e, WordEvent) and e.word.start >= later_s - 0.3])
    assert wer([dev_reference("sense_and_sensibility_01_austen_64kb-0880.wav")], [heard_later]) <= 0.25, heard_later
    assert Flushed(end_s) in events.events
    assert await await_until(lambda: replicas[survivor].served() == 1, timeout=10)  # counted as it ends


async def test_the_default_resolver_runs_off_the_loop_and_an_unknown_name_is_a_clear_refusal():
    assert "127.0.0.1" in await getaddrinfo_resolve("localhost", 80)
    rec = RemoteRecognizer("ws://no-such-replica.invalid:8080", open_timeout_s=3)
    with pytest.raises(RecognizerUnavailable, match="cannot resolve no-such-replica.invalid"):
        await rec.open_stream()
    empty = RemoteRecognizer(f"ws://{NAME}:1", resolve=FakeDns([]))
    with pytest.raises(RecognizerUnavailable, match="resolves to no address"):
        await empty.open_stream()
