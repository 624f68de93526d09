"""A real fleet on one host (issue 21's acceptance): HAProxy in front of two `duplex serve`
workers (WebSocket pass-through, `option httpchk GET /readyz`, least connections), two
`duplex asr-serve` replicas (the embedded Whisper) that both workers reach with
`--asr ws://A,ws://B`. Small caps so a 2-core machine holds it: 2 conversations per worker,
2 streams per replica. Every process listens on 127.0.0.1 only, on ports the test picks.

Shown, in order, with spoken flite questions:
1. 4 conversations at once through HAProxy's port are each heard and answered; each worker
   holds 2 and each replica 2 streams (their own /metrics); a fifth gets HTTP 503 before the
   upgrade.
2. A replica SIGKILLed while its callers are mid-utterance: their streams move to the other
   replica, the gap is counted in the worker's /metrics, and each caller's next turn is heard.
3. A worker SIGTERMed during a conversation finishes it; its /readyz says 503, HAProxy marks it
   down and sends the next conversation to the other worker; the drained worker exits 0.
4. Everything left stops cleanly (exit 0) when asked. Every wait is bounded.
The workers' measured-load admission is off (`--load-threshold 0`): the host's CPU is shared
with the other fleet processes, and the caps and /readyz are what is tested. The voice-to-voice
times of step 1 are printed (a figure for docs/deploying.md, not a check).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import await_until, flite_available, free_port, say, silence
from prometheus_client.parser import text_string_to_metric_families
from test_serving import refused_status
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from transport.web.client import FRAMES_PER_S, pcm16_frames

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(shutil.which("haproxy") is None,
                       reason="needs HAProxy (Debian package haproxy; scripts/setup.sh installs it)"),
    pytest.mark.skipif(not flite_available(), reason="needs flite"),
]

RATE = 16000
SLOTS = 2  # recognizer streams per replica
PER_WORKER = 2  # conversations per worker (--max-sessions)
TURN_TIMEOUT = 90.0  # the most one turn may take, question to reply done, on a loaded machine

# spoken question, words the transcript must hold (lower case)
QUESTIONS = [("What is the capital of France?", ("capital", "france")),
             ("How many legs does a spider have?", ("legs", "spider")),
             ("Who wrote Romeo and Juliet?", ("romeo", "juliet")),
             ("What is the tallest mountain in the world?", ("tallest", "mountain")),
             ("Tell me a short joke about cats.", ("joke", "cats")),
             ("What is the weather like on the moon?", ("weather", "moon"))]

HAPROXY_CFG = """\
global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout tunnel 300s   # a WebSocket conversation, once upgraded
    timeout queue 1s      # no waiting line: a full fleet refuses at once
    timeout check 3s      # a loaded worker may answer /readyz late: slow is not down
frontend agents
    bind 127.0.0.1:{port}
    default_backend workers
backend workers
    balance leastconn     # conversations are long: the emptiest worker takes the next
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 200ms fall 1 rise 1
{servers}
listen stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""


# ---- processes ----------------------------------------------------------------------------------
class Proc:
    """One fleet process, its output in a file (a pipe nobody reads would fill and block it)."""

    def __init__(self, name: str, cmd: list[str], log_dir: Path, port: int):
        self.name, self.port = name, port
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in kill)
        # four model processes share the host's cores: OpenMP workers that spin between
        # operations (agent/conversation/models.py's default for one server alone) would take them from each other
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY="PASSIVE")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, text=True)
        self.exit_code: int | None = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    async def status(self, path: str) -> int | None:
        try:
            return (await asyncio.to_thread(self.http, path))[0]
        except OSError:
            return None

    async def metrics(self) -> dict[tuple[str, tuple], float]:
        """/metrics through prometheus-client's parser: {(sample name, sorted labels): value}."""
        status, text = await asyncio.to_thread(self.http, "/metrics")
        assert status == 200, (self.name, status, text)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def wait_ready(self, timeout: float = 240.0) -> None:
        """Until its /readyz says 200 (models loaded, serving); bounded."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if await self.status("/readyz") == 200:
                return
            await asyncio.sleep(0.3)
        raise AssertionError(f"{self.name} not ready within {timeout:g} s (exit {self.proc.poll()}):\n"
                             f"{self.output()[-3000:]}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    async def exited(self, timeout: float) -> int | None:
        """The exit code once the process has ended (None if it is still running after `timeout`)."""
        try:
            self.exit_code = await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def kill(self) -> None:
        """Teardown: whatever is still running is killed (the test asserts the clean exits)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Fleet:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.replicas: list[Proc] = []
        self.workers: list[Proc] = []
        self.haproxy: Proc | None = None
        self.callers: list[Caller] = []  # shown when the test fails
        self.worker_args: list[str] = []
        self.port = self.stats_port = 0

    def start(self) -> None:
        py = [sys.executable, "-m", "agent.serving.cli"]
        for i in range(2):
            port = free_port()
            self.replicas.append(Proc(f"asr{i}", [*py, "asr-serve", "--host", "127.0.0.1", "--port", str(port),
                                                  "--slots", str(SLOTS), "--drain-timeout", "10"], self.tmp, port))
        asr = ",".join(f"ws://127.0.0.1:{r.port}" for r in self.replicas)
        for i in range(2):
            port = free_port()
            self.workers.append(Proc(f"worker{i}", [
                *py, "serve", "--host", "127.0.0.1", "--port", str(port), "--asr", asr,
                "--llm", "smollm2-135m", "--no-eou", "--max-tokens", "12", "--max-sessions", str(PER_WORKER),
                # the measured-load admission would refuse on a shared 2-core CPU; the cap
                # and /readyz are what is tested
                "--load-threshold", "0", "--drain-timeout", "60", *self.worker_args], self.tmp, port))

    async def start_haproxy(self) -> None:
        self.port, self.stats_port = free_port(), free_port()
        servers = "\n".join(f"    server {w.name} 127.0.0.1:{w.port} check" for w in self.workers)
        cfg = self.tmp / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(port=self.port, stats_port=self.stats_port, servers=servers))
        check = await asyncio.to_thread(subprocess.run, ["haproxy", "-c", "-f", str(cfg)], check=False,
                                        capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.haproxy = Proc("haproxy", ["haproxy", "-db", "-f", str(cfg)], self.tmp, self.stats_port)
        await self.all_up()

    async def all_up(self) -> None:
        """Until HAProxy's health checks have every worker UP."""
        up = {w.name: "UP" for w in self.workers}
        assert await poll(self.server_states, lambda v: v == up, 30) == up

    async def server_states(self) -> dict[str, str]:
        """HAProxy's view of the workers (its stats page, as CSV): name -> UP / DOWN / ..."""
        try:
            _, text = await asyncio.to_thread(self.haproxy.http, "/stats;csv")
        except OSError:
            return {}
        rows = [line.split(",") for line in text.lstrip("# ").splitlines()]
        if not rows:
            return {}
        head = rows[0]
        px, sv, st = head.index("pxname"), head.index("svname"), head.index("status")
        return {r[sv]: r[st].split()[0] for r in rows[1:]
                if len(r) > st and r[px] == "workers" and r[sv] not in ("FRONTEND", "BACKEND")}

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def all(self) -> list[Proc]:
        return [*self.replicas, *self.workers, *([self.haproxy] if self.haproxy else [])]

    def teardown(self) -> None:
        for p in self.all():
            p.kill()

    def logs(self) -> str:
        procs = "\n".join(f"===== {p.name} (exit {p.proc.poll()})\n{p.output()[-2500:]}" for p in self.all())
        return procs + "".join(f"\n===== caller {i}: {c!r}" for i, c in enumerate(self.callers))


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    try:
        f.start()
        yield f
    finally:
        f.teardown()
        print(f.logs())


# ---- conversations --------------------------------------------------------------------------------
class Caller:
    """A page-protocol caller (transport/web/protocol.py) with several turns: each question at real
    time, then silence (a live microphone) until that turn is over, then the next question. A turn
    is over when its reply is done, or when the session heard nothing to answer in it (its final
    came and the session listens again without replying: a question lost in a recognizer gap)."""

    def __init__(self, fleet: Fleet, questions: list[np.ndarray]):
        self.url, self.questions = fleet.url, questions
        fleet.callers.append(self)
        self.events: list[dict] = []
        self.marks: list[int] = []  # where each question's events begin in `events`
        self.speaking = asyncio.Event()  # set while a question's speech is being sent
        self.turns_over = asyncio.Event()  # every question was sent and its turn is over
        self.hang_up = asyncio.Event()  # set it to end the call once the turns are over
        self.close_code: int | None = None

    def __repr__(self) -> str:
        said = [(e["type"], e.get("turn"), e.get("text") or e.get("message") or e.get("state"))
                for e in self.events if e.get("type") in ("final", "bot_done", "error", "state")]
        return f"Caller(marks {self.marks}, closed {self.close_code}, {said})"

    def turn(self, k: int) -> list[dict]:
        """The events from question `k` on to the next one."""
        end = self.marks[k + 1] if k + 1 < len(self.marks) else len(self.events)
        return self.events[self.marks[k]:end]

    def answered(self, k: int, words: tuple[str, ...]) -> bool:
        """Question `k` was heard (a final transcript holds `words`) and a reply was spoken."""
        events = self.turn(k)
        heard = any(all(w in e.get("text", "").lower() for w in words) for e in events if e["type"] == "final")
        return heard and any(e["type"] == "bot_done" and e.get("text", "").strip() for e in events)

    def errors(self) -> list[dict]:
        return [e for e in self.events if e.get("type") == "error"]

    def _turn_over(self, since: int) -> bool:
        new = self.events[since:]
        if any(e["type"] in ("bot_done", "error") for e in new):
            return True
        finals = [i for i, e in enumerate(new) if e["type"] == "final"]
        states = [e.get("state") for e in new[finals[-1]:] if e["type"] == "state"] if finals else []
        return bool(states) and states[-1] == "listening" and "bot_speaking" not in states

    async def run(self) -> None:
        quiet = bytes(2 * (RATE // FRAMES_PER_S))
        loop = asyncio.get_running_loop()
        # no keepalive of the caller's own: the server pings, and a busy test loop must not end the call
        async with connect(self.url, open_timeout=10, max_size=1 << 22, ping_interval=None) as ws:
            reader = asyncio.create_task(self._read(ws))
            try:
                await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))
                t0, k = loop.time(), 0

                async def send(frame: bytes) -> None:
                    nonlocal k
                    await ws.send(frame)
                    k += 1
                    await asyncio.sleep(max(0.0, t0 + k / FRAMES_PER_S - loop.time()))

                for question in self.questions:
                    self.marks.append(since := len(self.events))
                    self.speaking.set()
                    for frame in pcm16_frames(question, RATE):
                        await send(frame)
                    self.speaking.clear()
                    # the microphone stays live until this turn is over (bounded: a lost turn fails
                    # the test's own checks, not this loop)
                    deadline = loop.time() + TURN_TIMEOUT
                    while not self._turn_over(since) and not reader.done() and loop.time() < deadline:
                        await send(quiet)
                self.turns_over.set()
                while not self.hang_up.is_set() and not reader.done():
                    await send(quiet)
            finally:
                self.turns_over.set()
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, ws) -> None:
        try:
            async for msg in ws:
                if isinstance(msg, str):
                    self.events.append(json.loads(msg))
        except ConnectionClosed as e:
            self.close_code = e.rcvd.code if e.rcvd else 1006


def question_audio(tmp: Path, i: int) -> np.ndarray:
    text, _ = QUESTIONS[i]
    return np.concatenate([silence(0.3), say(text, tmp / f"q{i}.wav"), silence(0.2)])


def words(i: int) -> tuple[str, ...]:
    return QUESTIONS[i][1]


async def sessions_by_worker(fleet: Fleet) -> list[float]:
    return [metric(await w.metrics(), "duplex_sessions_active") for w in fleet.workers
            if w.proc.poll() is None]


async def streams_by_replica(fleet: Fleet) -> list[float]:
    return [metric(await r.metrics(), "duplex_asr_streams_active") for r in fleet.replicas
            if r.proc.poll() is None]


async def poll(fn, want, timeout: float) -> object:
    """`await fn()` until `want(value)` holds or `timeout` passes; the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await fn()
        if want(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


async def turns_over(callers: list[Caller]) -> None:
    """Every caller's turns are over (each caller bounds each of its turns)."""
    await asyncio.gather(*(c.turns_over.wait() for c in callers))


async def hang_up(callers: list[Caller], tasks: list[asyncio.Task]) -> None:
    for c in callers:
        c.hang_up.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


# ---- the test ---------------------------------------------------------------------------------------
@pytest.mark.timeout(600)
async def test_fleet_behind_haproxy_shares_fails_over_and_drains(fleet, tmp_path):
    audio = [question_audio(tmp_path, i) for i in range(len(QUESTIONS))]
    for p in fleet.replicas + fleet.workers:
        await p.wait_ready()
    await fleet.start_haproxy()

    # 1. four at once, shared by workers and replicas; a fifth is refused before the upgrade
    callers = [Caller(fleet, [audio[i]]) for i in range(4)]
    tasks = [asyncio.create_task(c.run()) for c in callers]
    assert await poll(lambda: sessions_by_worker(fleet), lambda v: v == [PER_WORKER] * 2, 20) == [PER_WORKER] * 2
    assert await poll(lambda: streams_by_replica(fleet), lambda v: v == [SLOTS] * 2, 20) == [SLOTS] * 2
    assert await refused_status(fleet.url) == 503
    await turns_over(callers)
    for i, c in enumerate(callers):
        assert not c.errors() and c.answered(0, words(i)), (i, c)
    await hang_up(callers, tasks)
    print("fleet: 4 at once, voice-to-voice ms (server):",  # a figure for docs/deploying.md, not a check
          [e.get("voice_to_voice_ms") for c in callers for e in c.events if e.get("type") == "latency"])
    assert await poll(lambda: sessions_by_worker(fleet), lambda v: v == [0, 0], 20) == [0, 0]
    served_by = [metric(await w.metrics(), "duplex_sessions_total", result="served") for w in fleet.workers]
    assert served_by == [PER_WORKER] * 2, served_by
    await fleet.all_up()  # full, both were marked down; HAProxy refuses callers until it sees them up

    # 2. a replica SIGKILLed while its callers are mid-utterance: the next turn is understood
    callers = [Caller(fleet, [audio[4], audio[1]]), Caller(fleet, [audio[5], audio[0]])]
    tasks = [asyncio.create_task(c.run()) for c in callers]
    streams = await poll(lambda: streams_by_replica(fleet), lambda v: sum(v) == 2, 20)
    assert sum(streams) == 2, streams
    assert await await_until(lambda: all(c.speaking.is_set() for c in callers), timeout=20)
    await asyncio.sleep(0.8)  # into the question's words, not its leading silence
    assert all(c.speaking.is_set() for c in callers)
    victim = fleet.replicas[int(np.argmax(streams))]
    moved = max(streams)  # the victim's callers
    failovers_before = [metric(await w.metrics(), "duplex_recognizer_failovers_total") for w in fleet.workers]
    victim.signal(signal.SIGKILL)
    assert await victim.exited(10) == -signal.SIGKILL
    survivor = next(r for r in fleet.replicas if r is not victim)
    assert await poll(lambda: streams_by_replica(fleet), lambda v: v == [2], 20) == [2]
    await turns_over(callers)
    for c, i in zip(callers, (1, 0), strict=True):
        assert not c.errors() and c.answered(1, words(i)), (i, c)
    pool = [await w.metrics() for w in fleet.workers]
    failovers = sum(metric(m, "duplex_recognizer_failovers_total") for m in pool) - sum(failovers_before)
    assert failovers == moved, (failovers, moved)
    assert sum(metric(m, "duplex_recognizer_gaps_total") for m in pool) == moved
    assert sum(metric(m, "duplex_recognizer_gap_seconds_total") for m in pool) > 0
    await hang_up(callers, tasks)
    assert await poll(lambda: streams_by_replica(fleet), lambda v: v == [0], 20) == [0]
    assert await poll(lambda: sessions_by_worker(fleet), lambda v: v == [0, 0], 20) == [0, 0]
    await fleet.all_up()

    # 3. a worker SIGTERMed during a conversation finishes it and takes no new one
    first = Caller(fleet, [audio[2]])
    talking = asyncio.create_task(first.run())
    live = await poll(lambda: sessions_by_worker(fleet), lambda v: sum(v) == 1, 20)
    assert sum(live) == 1, live
    drained = fleet.workers[live.index(1)]
    other = next(w for w in fleet.workers if w is not drained)
    assert await await_until(lambda: first.speaking.is_set(), timeout=20)
    drained.signal(signal.SIGTERM)
    assert await poll(lambda: drained.status("/readyz"), lambda s: s == 503, 10) == 503
    states = await poll(fleet.server_states, lambda v: v.get(drained.name) == "DOWN", 10)
    assert states.get(drained.name) == "DOWN", states
    served_before = metric(await other.metrics(), "duplex_sessions_total", result="served")
    second = Caller(fleet, [audio[3]])
    second_task = asyncio.create_task(second.run())
    # the new one went to the other worker; the drained one still holds only the first
    assert await poll(lambda: sessions_by_worker(fleet), lambda v: v == [1, 1], 20) == [1, 1]
    await turns_over([first, second])
    for c, i in ((first, 2), (second, 3)):
        assert not c.errors() and c.answered(0, words(i)), (i, c)
    assert drained.proc.poll() is None  # still there for the caller who stays
    await hang_up([first, second], [talking, second_task])
    assert await drained.exited(30) == 0, drained.output()[-3000:]
    assert "drained; bye" in drained.output()
    assert metric(await other.metrics(), "duplex_sessions_total", result="served") == served_before + 1

    # 4. the rest stop cleanly when asked
    for p in (other, survivor):
        p.signal(signal.SIGTERM)
    fleet.haproxy.signal(signal.SIGUSR1)  # HAProxy's soft stop: it ends once its connections have
    codes = {p.name: await p.exited(60) for p in (other, survivor, fleet.haproxy)}
    assert codes == {other.name: 0, survivor.name: 0, "haproxy": 0}, codes
