"""The push-based recognizer streams over Kyutai's messages: the in-process engine
(asr.engine.recognizer), the remote client (asr.remote) against an in-process `AsrServer` on
127.0.0.1, their shared core (asr.moshi_stream) and the name dispatch (asr.load_recognizer).

No real model: a tiny random Kyutai model whose lm_head rows are permuted so that it often emits
the word-boundary (0) and pad (3) tokens, i.e. words (the plain tiny model rarely does). Every
wait is on what it checks, bounded by a timeout; tests/helpers.wait_until polls with time.sleep,
which would block the event loop these tests run on, so they use its async twin `await_until`.
They run on the virtual clock (tests/virtual_time.py): servers, clients and the engine's steps
(thread jobs) are all on the test's loop, so idle timeouts and reconnect back-offs take no wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys

import numpy as np
import pytest

from asr.base import Flushed, Gap, Partial, PauseProbability, RecognizerFailed, RecognizerUnavailable, Word, WordEvent
from asr.engine.recognizer import EngineRecognizer
from asr.engine.kyutai import LoadedModel, emit_words_often, engine_from_hf, tiny_hf_model
from asr.moshi_protocol import Audio, EndWord, MarkerReply, Step, encode_client
from asr.moshi_protocol import Word as WordMessage
from asr.moshi_stream import MAX_CHUNK, MoshiEventCore, StreamClock
from asr.remote import RemoteRecognizer
from asr.engine.scheduler import EngineScheduler, SchedulerConfig
from asr.serving.server import AsrServer

sys.path.insert(0, os.path.dirname(__file__))
from helpers import StreamEvents, await_until, free_port, kernel_socket_buffer_bytes  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "virtual_clock")

SR = 24000
FRAME = 1920
DELAY_FRAMES = 2
TIMEOUT = 30.0


# ---- fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def wordy_hf():
    """The tiny random model with tokens 0<->34 and 3<->13 swapped in its output layer: with the
    audio below it emits about ten words per 4 s (found by trying the frequent tokens)."""
    hf = tiny_hf_model(seed=0, window=8)
    emit_words_often(hf)
    return hf


def wordy_model(hf, slots: int) -> LoadedModel:
    return LoadedModel(engine=engine_from_hf(hf, slots), asr_delay_frames=DELAY_FRAMES,
                       decode=lambda ids: "".join(f"<{i}>" for i in ids), name="tiny-wordy (random)",
                       is_random=True)


def audio(seed: int, frames: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME) / SR
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.2 * rng.standard_normal(t.size)).astype(np.float32)


class Collector(StreamEvents):
    """The stream's events, as a conversation reads them."""

    def before_flushed(self, n: int = 1) -> list:
        """Events before the n-th Flushed."""
        seen = 0
        for i, e in enumerate(self.events):
            if isinstance(e, Flushed):
                seen += 1
                if seen == n:
                    return self.events[:i]
        raise AssertionError(f"fewer than {n} Flushed events")


async def feed_in_chunks(stream, pcm: np.ndarray, chunk: int = 480) -> None:
    """20 ms pieces, as transports deliver them: not aligned with the model's 80 ms frames."""
    for i in range(0, pcm.size, chunk):
        await stream.feed(pcm[i:i + chunk])


async def session_messages(sched: EngineScheduler, pcm: np.ndarray) -> list:
    """The direct protocol path: an EngineSession fed `pcm` (whole frames), read to its last Step."""
    assert pcm.size % FRAME == 0
    session = await sched.open_session()
    try:
        await session.feed(pcm)
        got: list = []
        async with asyncio.timeout(TIMEOUT):
            while not any(isinstance(m, Step) and m.step_idx == pcm.size // FRAME for m in got):
                got += await session.messages()
        return got
    finally:
        await session.close()


def protocol_words(msgs) -> tuple[list[tuple[str, int, int]], tuple[str, int] | None]:
    """(closed words as (text, start, end) in model samples, the word still open) of a message list,
    by the rule the streams follow: a word ends at its EndWord, or else where the next one starts."""
    closed, open_word = [], None
    for m in msgs:
        if isinstance(m, WordMessage):
            if open_word is not None:  # a pad ended its text, no EndWord came: it ends where this starts
                closed.append((*open_word, round(m.start_time * SR)))
            open_word = (m.text, round(m.start_time * SR))
        elif isinstance(m, EndWord) and open_word is not None:
            closed.append((*open_word, round(m.stop_time * SR)))
            open_word = None
    return closed, open_word


@contextlib.asynccontextmanager
async def asr_server(hf, slots: int = 2, port: int = 0, api_keys=("public_token",), start: bool = True, **cfg):
    sched = EngineScheduler(wordy_model(hf, slots), SchedulerConfig(**cfg))
    server = AsrServer(sched, api_keys)
    async with contextlib.AsyncExitStack() as stack:
        if start:
            await stack.enter_async_context(sched)
        bound = await stack.enter_async_context(server.serving("127.0.0.1", port))
        yield sched, f"ws://127.0.0.1:{bound}"


@contextlib.asynccontextmanager
async def engine_recognizer(hf, slots: int = 2):
    rec = EngineRecognizer(wordy_model(hf, slots))
    try:
        yield rec
    finally:
        await rec.aclose()


async def transcribe(stream, pcm: np.ndarray) -> Collector:
    """Feed `pcm`, flush at its end, close; the events."""
    events = Collector(stream)
    await feed_in_chunks(stream, pcm)
    await stream.flush(pcm.size / SR)
    await stream.close()
    await asyncio.wait_for(events.task, TIMEOUT)
    return events


# ---- the Sans-I/O core ------------------------------------------------------------------------
def test_clock_maps_model_time_back_across_inserted_silence():
    clock = StreamClock()
    clock.fed(1000)
    clock.inserted(500)  # model [1000, 1500) is the stream's own silence
    clock.fed(200)
    assert [clock.to_caller(m) for m in (0, 999, 1000, 1499, 1500, 1700)] == [0, 999, 1000, 1000, 1000, 1200]
    assert clock.to_model(1000) == 1500 and clock.to_model(999) == 999 and clock.to_model(1100) == 1600
    assert clock.to_model(1300) == 1800  # past what was fed: extrapolated
    clock.fed(300, sent=False)  # a lost link: the caller's clock runs on
    clock.restart()
    assert clock.link_start == 1500 and clock.to_caller(0) == 1500 and clock.to_caller(480) == 1980
    assert clock.to_model(100) == 0  # before this link began


def test_core_words_partials_and_flush_closing_the_open_word():
    core = MoshiEventCore(delay_s=DELAY_FRAMES / 12.5)
    core.clock.fed(SR)  # 1 s of caller audio
    events = core.on_message(WordMessage("a", 0.08))
    assert events == [Partial("a", "")]
    events = core.on_message(EndWord(0.4))
    assert events == [WordEvent(Word("a", 0.08, 0.4)), Partial("a", "a")]
    core.on_message(WordMessage("b", 0.4))
    # a server that sends no EndWord: the next Word's start ends the word before
    assert core.on_message(WordMessage("c", 0.56))[0] == WordEvent(Word("b", 0.4, 0.56))
    plan = core.plan_flush(0.9)
    assert plan.silence_before > 0 and plan.silence_after > 0
    core.clock.inserted(plan.silence_before)
    core.clock.inserted(plan.silence_after)
    events = core.on_message(MarkerReply(plan.marker_id))
    # "c" started before 0.9 and is still open: the flush's silence ends it at 0.9
    assert events[0] == WordEvent(Word("c", 0.56, 0.9))
    assert events[1:3] == [Partial("a b c", "a b c"), Flushed(0.9)]
    assert core.on_message(EndWord(1.3)) == []  # c's late EndWord (inside the silence) is dropped
    core.on_message(WordMessage("d", 1.2))  # model 1.2 s lies in the inserted silence: caller 1.0 s
    assert core.on_message(EndWord(1.0 + plan.silence_before / SR + plan.silence_after / SR + 0.08)) == [
        WordEvent(Word("d", 1.0, 1.08)), Partial("d", "d")]  # text since the flush only


def test_core_pause_probability_from_moshi_steps_on_the_callers_clock():
    core = MoshiEventCore(delay_s=0.5)
    core.clock.fed(10 * FRAME)
    assert core.on_message(Step(5, (0.1, 0.2, 0.7))) == [PauseProbability(0.4, 0.7)]  # prs[2], moshi's
    core.clock.inserted(3 * FRAME)
    core.clock.fed(FRAME)
    assert core.on_message(Step(12, (0.1, 0.2, 0.9))) == []  # inside the stream's own silence
    assert core.on_message(Step(14, (0.1, 0.2, 0.3))) == [PauseProbability(11 * FRAME / SR, 0.3)]
    assert core.on_message(Step(15, (0.5,))) == []  # one value (Whisper's speech probability): no pause head


# ---- the in-process engine --------------------------------------------------------------------
async def test_engine_stream_words_equal_the_session_protocol_words(wordy_hf):
    pcm = audio(1, 50)
    until_s = pcm.size / SR
    async with engine_recognizer(wordy_hf) as rec:
        stream = await rec.open_stream()
        events = Collector(stream)
        await feed_in_chunks(stream, pcm)
        await stream.flush(until_s)
        inserted = stream.model_samples - pcm.size
        assert await await_until(lambda: any(isinstance(e, Flushed) for e in events.events))
        await stream.close()
        await asyncio.wait_for(events.task, TIMEOUT)
        # The same audio and the same silence through an EngineSession of the same engine.
        msgs = await session_messages(rec.scheduler, np.concatenate([pcm, np.zeros(inserted, np.float32)]))
    closed, open_word = protocol_words(msgs)

    def to_caller(m: int) -> float:
        return min(m, pcm.size) / SR  # model time inside the flush's silence: where it began

    want = [(t, to_caller(s), to_caller(e)) for t, s, e in closed]
    if open_word is not None and open_word[1] < pcm.size:
        want.append((open_word[0], to_caller(open_word[1]), until_s))  # closed by the flush
    got = events.before_flushed()
    assert len(want) >= 5, "the model should say something"
    assert events.words(got) == want
    rest = events.events[len(got):]
    assert rest[0] == Flushed(until_s)
    assert all(isinstance(e, Partial) for e in rest[1:]), "the stream was closed right after the flush"
    partials = [e for e in got if isinstance(e, Partial)]
    assert all(p.text.startswith(p.stable_text) for p in partials)
    assert partials[-1] == Partial(" ".join(w[0] for w in want), " ".join(w[0] for w in want))


async def test_times_stay_on_the_callers_clock_after_a_flush_inserted_silence(wordy_hf):
    a, b = audio(2, 30), audio(3, 40)
    a_s, total_s = a.size / SR, (a.size + b.size) / SR
    async with engine_recognizer(wordy_hf) as rec:
        stream = await rec.open_stream()
        events = Collector(stream)
        await feed_in_chunks(stream, a)
        await stream.flush(a_s)
        s1 = stream.model_samples - a.size
        await feed_in_chunks(stream, b)
        await stream.flush(total_s)
        s2 = stream.model_samples - a.size - s1 - b.size
        await stream.close()
        await asyncio.wait_for(events.task, TIMEOUT)
        zeros = np.zeros
        model_in = np.concatenate([a, zeros(s1, np.float32), b, zeros(s2, np.float32)])
        msgs = await session_messages(rec.scheduler, model_in)
    assert s1 > 0 and s2 > 0

    def to_caller(m: int) -> float:
        if m <= a.size:
            return m / SR
        if m < a.size + s1:
            return a_s  # inside the first flush's silence
        return min(m - s1, a.size + b.size) / SR

    closed, open_word = protocol_words(msgs)
    # the words of the second piece (they start after the first flush) are where the caller put them
    want = [(t, to_caller(s), to_caller(e)) for t, s, e in closed if to_caller(s) >= a_s]
    if open_word is not None and to_caller(open_word[1]) < total_s:
        want.append((open_word[0], to_caller(open_word[1]), total_s))
    words = events.words()
    assert len(want) >= 4
    assert [w for w in words if w[1] >= a_s] == want
    assert all(0 <= s <= e <= total_s for _, s, e in words)
    assert all(words[i][2] <= words[i + 1][1] for i in range(len(words) - 1)), "words overlap"
    flushed = [e for e in events.events if isinstance(e, Flushed)]
    assert flushed == [Flushed(a_s), Flushed(total_s)]
    first_flush = events.before_flushed(1)
    assert all(e <= a_s for _, _, e in events.words(first_flush))


async def test_slots_refuse_then_reuse_and_share_one_batched_step(wordy_hf):
    async with engine_recognizer(wordy_hf, slots=2) as rec:
        one, two = await rec.open_stream(), await rec.open_stream()
        with pytest.raises(RecognizerUnavailable, match="all 2 recognizer slots are busy"):
            await rec.open_stream()
        sched = rec.scheduler
        # both streams fed before the tick loop runs: every step advances both rows at once
        await one.feed(audio(4, 10))
        await two.feed(audio(5, 10))
        assert await await_until(lambda: one.link.session.frames_done == 10 and two.link.session.frames_done == 10)
        assert list(sched.active_rows) == [2] * 10 and sched.ticks == 10
        freed = one.link.session.slot
        await one.close()
        three = await rec.open_stream()
        assert three.link.session.slot == freed and three.link.session.needs_reset
        ticks = sched.ticks
        await three.feed(np.zeros(FRAME, np.float32))
        assert await await_until(lambda: three.link.session.frames_done == 1)
        assert sched.ticks == ticks + 1 and sched.active_rows[-1] == 1  # served within one tick
        for s in (two, three):
            await s.close()
        assert not sched.sessions


async def test_evicted_engine_slot_fails_the_stream(wordy_hf):
    rec = EngineRecognizer(wordy_model(wordy_hf, 1), SchedulerConfig(idle_timeout_s=0.3))
    try:
        stream = await rec.open_stream()
        events = Collector(stream)
        await stream.feed(audio(6, 2))
        await asyncio.wait_for(events.task, TIMEOUT)  # no more input: evicted
        assert isinstance(events.error, RecognizerFailed) and "idle timeout" in str(events.error)
        with pytest.raises(RecognizerFailed, match="idle timeout"):
            await stream.feed(audio(6, 1))
        with pytest.raises(RecognizerFailed, match="idle timeout"):
            await stream.flush(0.1)
        await stream.close()
        await (await rec.open_stream()).close()  # the slot is free again
    finally:
        await rec.aclose()


async def test_closed_stream_ends_its_events_and_tasks(wordy_hf):
    async with engine_recognizer(wordy_hf) as rec:
        stream = await rec.open_stream()
        events = Collector(stream)
        await stream.feed(audio(6, 3))
        await stream.close()
        await asyncio.wait_for(events.task, TIMEOUT)
        assert events.error is None
        with pytest.raises(RecognizerFailed, match="closed"):
            await stream.feed(audio(6, 1))
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("asr-stream")]
        await stream.close()  # idempotent


# ---- remote -----------------------------------------------------------------------------------
async def test_remote_streams_equal_engine_streams(wordy_hf):
    clips = [audio(7, 40), audio(8, 30)]
    async with engine_recognizer(wordy_hf) as rec:
        local = [await transcribe(await rec.open_stream(), pcm) for pcm in clips]
    async with asr_server(wordy_hf, slots=2) as (_, url):
        remote = RemoteRecognizer(url)
        streams = [await remote.open_stream() for _ in clips]  # two slots of one server at once
        got = await asyncio.gather(*(transcribe(s, pcm) for s, pcm in zip(streams, clips)))
    for here, there in zip(local, got):
        assert len(here.words()) >= 4
        assert there.events == here.events


async def test_remote_fails_over_to_a_server_with_room(wordy_hf):
    closed_port = f"ws://127.0.0.1:{free_port()}"
    async with asr_server(wordy_hf, slots=1) as (full_sched, full), \
            asr_server(wordy_hf, slots=1) as (good_sched, good):
        taken = await full_sched.open_session()
        remote = RemoteRecognizer(f"{closed_port},{full}, {good}")
        for _ in range(3):  # whatever the random order, the one with room gets it
            stream = await remote.open_stream()
            assert stream.link.url.startswith(good)
            events = await transcribe(stream, audio(9, 20))
            assert Flushed(20 * FRAME / SR) in events.events
            assert await await_until(lambda: not good_sched.sessions)  # the server frees the slot after our close
        with pytest.raises(RecognizerUnavailable) as refused:
            await RemoteRecognizer([closed_port, full]).open_stream()
        message = str(refused.value)
        assert closed_port in message and full in message
        assert "no free slot" in message and "refused" in message.lower()
        await taken.close()


async def test_remote_reconnects_after_the_server_restarts_with_a_gap(wordy_hf):
    port = free_port()
    first = audio(10, 30)
    async with contextlib.AsyncExitStack() as stack:
        _, url = await stack.enter_async_context(asr_server(wordy_hf, port=port))
        stream = await RemoteRecognizer(url, reconnect_timeout_s=20).open_stream()
        events = Collector(stream)
        await feed_in_chunks(stream, first)
        await stream.flush(first.size / SR)
        words_before = len(events.words())
        assert words_before >= 3
    # the server is really gone: listening socket and connections closed, scheduler stopped
    await stream.feed(audio(11, 5))  # reaches no recognizer (or a dead socket)
    async with asr_server(wordy_hf, port=port) as (sched, _):
        assert await await_until(lambda: stream.gaps == 1)
        assert len(sched.sessions) == 1
        second = audio(12, 40)
        await feed_in_chunks(stream, second)
        end_s = stream.fed_samples / SR
        await stream.flush(end_s)
        await stream.close()
        await asyncio.wait_for(events.task, TIMEOUT)
    gaps = [i for i, e in enumerate(events.events) if isinstance(e, Gap)]
    assert len(gaps) == 1
    gap = events.events[gaps[0]]
    assert first.size / SR - 0.5 <= gap.start_s <= gap.end_s <= end_s - second.size / SR
    assert gap.end_s >= (first.size + 5 * FRAME) / SR - 1e-9  # the audio fed while it was down
    assert gap.reason
    after = events.words(events.events[gaps[0]:])
    assert len(after) >= 3, "the new server transcribes the rest"
    assert all(gap.end_s <= s <= e <= end_s for _, s, e in after)
    assert [e for e in events.events if isinstance(e, Flushed)][-1] == Flushed(end_s) and events.error is None


async def test_remote_eviction_is_final(wordy_hf):
    """An idle stream evicted by the server fails instead of reconnecting: an abandoned stream
    must not keep a slot somewhere forever."""
    async with asr_server(wordy_hf, idle_timeout_s=0.3) as (sched, url):
        stream = await RemoteRecognizer(url).open_stream()
        events = Collector(stream)
        await asyncio.wait_for(events.task, TIMEOUT)
        assert isinstance(events.error, RecognizerFailed) and "evicted" in str(events.error)
        assert stream.gaps == 0 and not sched.sessions
        await stream.close()


async def test_remote_api_key(wordy_hf):
    async with asr_server(wordy_hf, api_keys=("s3cret",)) as (_, url):
        stream = await RemoteRecognizer(url, api_key="s3cret").open_stream()
        await transcribe(stream, audio(13, 10))
        for key in (None, "", "wrong"):  # None: moshi's default key, public_token
            with pytest.raises(RecognizerUnavailable, match="HTTP 401: missing or wrong API key"):
                await RemoteRecognizer(url, api_key=key).open_stream()


async def test_remote_feed_waits_when_the_server_stops_reading(wordy_hf):
    """A server whose engine does not run yet: its buffer fills, then the socket, then our bounded
    send queue, and `feed` waits; closing the stream releases it."""
    async with asr_server(wordy_hf, start=False, buffer_seconds=1.0) as (sched, url):
        stream = await RemoteRecognizer(url, send_queue_frames=4).open_stream()
        second = np.zeros(SR, np.float32)

        async def flood():
            for _ in range(3600):
                await stream.feed(second)

        flooding = asyncio.create_task(flood())
        link = stream.link
        message = second[:MAX_CHUNK]  # feed sends at most this much per message

        def server_full() -> bool:
            s = sched.sessions[0] if sched.sessions else None
            return s is not None and s.capacity - s.buffered_samples < message.size

        assert await await_until(lambda: server_full() and link._queue.full())
        # Nothing drains anything now: the server holds its 1 s, the kernel's socket buffers and
        # websockets' small queues hold a bounded amount, our queue is full and feed waits.
        message_bytes = len(encode_client(Audio(message)))
        slack_s = 3 + (kernel_socket_buffer_bytes() + 2**20) / message_bytes
        assert stream.fed_samples / SR <= 1 + 4 + slack_s
        assert not flooding.done()
        await stream.close()
        with pytest.raises(RecognizerFailed):
            await asyncio.wait_for(flooding, TIMEOUT)
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("asr-stream", "asr-remote"))]
        async with sched:  # the engine runs at last: the server drains what was in flight, sees the close
            assert await await_until(lambda: not sched.sessions)


# ---- dispatch ---------------------------------------------------------------------------------
def test_recognizer_names_dispatch(tmp_path):
    from asr import recognizer_kind

    assert recognizer_kind("whisper-tiny.en") == recognizer_kind("tiny.en") == recognizer_kind("base.en") == "whisper"
    assert recognizer_kind("Systran/faster-whisper-small") == "whisper"
    assert recognizer_kind("kyutai/stt-1b-en_fr") == recognizer_kind("tiny-random") == "engine"
    assert recognizer_kind("ws://a:1,wss://b:2") == "remote"
    kyutai_dir, ct2_dir, other_dir = tmp_path / "k", tmp_path / "w", tmp_path / "o"
    for d in (kyutai_dir, ct2_dir, other_dir):
        d.mkdir()
    (kyutai_dir / "config.json").write_text(json.dumps({"model_type": "kyutai_speech_to_text"}))
    (ct2_dir / "model.bin").write_bytes(b"")
    (other_dir / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert recognizer_kind(str(kyutai_dir)) == "engine" and recognizer_kind(str(ct2_dir)) == "whisper"
    with pytest.raises(ValueError, match="neither a CTranslate2 Whisper model"):
        recognizer_kind(str(other_dir))
    with pytest.raises(ValueError, match="unknown recognizer 'nonsense'"):
        recognizer_kind("nonsense")


def test_load_recognizer_builds_engine_and_remote():
    from asr import load_recognizer

    remote = load_recognizer("ws://127.0.0.1:1, ws://[::1]:2/custom", api_key="k")
    assert isinstance(remote, RemoteRecognizer)
    assert remote.urls == ["ws://127.0.0.1:1/api/asr-streaming", "ws://[::1]:2/custom"] and remote.api_key == "k"
    engine = load_recognizer("tiny-random", slots=1)
    assert isinstance(engine, EngineRecognizer) and engine.slots == 1 and engine.delay_s == pytest.approx(0.16)
    assert load_recognizer("tiny-random", slots=1) is engine  # one engine per process
    with pytest.raises(ValueError, match="not a recognizer URL"):
        load_recognizer("ws://")
