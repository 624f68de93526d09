"""`duplex asr-bench`: load client and benchmarks for the streaming ASR server and engine.

Modes:
- default: N concurrent clients stream audio over the moshi protocol, at real-time pace or
  k x real time (`--speed`), to `--url` or to an in-process server (tiny random model unless
  `--model`). Reports RTF, WER/CER against `--refs`, first-word and per-word latency
  percentiles, and RSS (plus torch.cuda memory in-process on CUDA) over time. With
  `--price-per-hour` (the device's price), the cost per stream-hour: the price over the
  streams held at real time, beside the seed figures (Kyutai ~1.5 c, a commercial API ~15 c).
- `--engine-throughput`: tiny random engine on the local CPU, B = 1, 4, 16: step time and
  throughput (streams x frames / s) batched versus B sequential single-stream runs. Each pool
  times its Mimi convs' paths first, as `asr-serve` does (`--no-tune-convs`: oneDNN for all).
- `--memory`: RSS over a synthetic one-hour stream (45,000 engine steps), then over a client
  flooding an in-process server at 10x real time.
- `--scheduler`: for each N of `--sizes` (1, 4, 16), N conversations fed straight into the
  in-process `EngineScheduler`'s sessions (no sockets) at real time: step time, rows stepped
  per tick (how much batching the tick loop gets from conversations that arrive on their own
  clocks), the engine's real-time factor and each frame's latency to its Step.
Figures are printed; nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

import numpy as np

from asr.moshi_protocol import FRAME_SIZE as FRAME
from asr.moshi_protocol import SAMPLE_RATE


def rss_mib(pid: int | None = None) -> float:
    with open(f"/proc/{pid or 'self'}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cuda_mib() -> str:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return f" cuda_alloc={torch.cuda.memory_allocated() / 2**20:.0f}MiB"
    except Exception:
        pass
    return ""


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# ---- cost per stream-hour ---------------------------------------------------------------------
MAX_LAG_S = 2.0  # a stream's last words this long after its audio ended, at most: it kept up with its caller
# the issue's seed comparison: Kyutai's server at ~400 streams per H100 (~$6/h), a commercial API
SEED_COSTS = "seed: Kyutai ~400 streams/H100 ~1.5 c/stream-hour; commercial streaming API ~15 c"


def cents_per_stream_hour(price_per_hour: float, streams: int) -> float:
    """What one stream-hour costs on a device rented at `price_per_hour` ($) that serves `streams`
    at real time: the price shared by the streams, in cents."""
    if streams < 1:
        raise ValueError("no stream held at real time: no cost per stream")
    return 100.0 * price_per_hour / streams


def cost_line(price_per_hour: float, streams: int, held: bool, why: str) -> str:
    if not held:
        return f"cost: none computed at ${price_per_hour:g}/h: {why}"
    return (f"cost: ${price_per_hour:g}/h / {streams} streams at real time = "
            f"{cents_per_stream_hour(price_per_hour, streams):.2f} c/stream-hour ({SEED_COSTS})")


# ---- load client ---------------------------------------------------------------------------
@dataclass
class ClientResult:
    audio_s: float
    wall_s: float = 0.0
    words: list[str] = field(default_factory=list)
    first_word_latency: float | None = None
    word_latencies: list[float] = field(default_factory=list)  # Word arrival - word start in the audio
    end_latencies: list[float] = field(default_factory=list)  # EndWord arrival - word end in the audio
    error: str | None = None


def load_audio(path: str) -> np.ndarray:
    import soundfile as sf

    pcm, sr = sf.read(path, dtype="float32", always_2d=True)
    pcm = pcm.mean(axis=1)
    if sr != SAMPLE_RATE:
        import soxr

        pcm = soxr.resample(pcm, sr, SAMPLE_RATE).astype(np.float32)
    return pcm


def synthetic_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.2 * np.sin(2 * np.pi * (180 + 20 * seed) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


async def run_client(url: str, api_key: str, pcm: np.ndarray, speed: float, delay_frames: int,
                     chunk: int = FRAME) -> ClientResult:
    """Stream `pcm` at `speed` x real time (0 = as fast as possible), then flush and wait."""
    import msgpack
    import websockets

    res = ClientResult(audio_s=pcm.size / SAMPLE_RATE)
    tail = np.zeros((delay_frames + 4) * FRAME, np.float32)
    async with websockets.connect(url, additional_headers={"kyutai-api-key": api_key},
                                  max_size=None, close_timeout=1) as ws:
        first = msgpack.unpackb(await ws.recv())
        if first["type"] != "Ready":
            res.error = first.get("message", str(first))
            return res
        t0 = time.perf_counter()

        async def send():
            for i in range(0, pcm.size, chunk):
                if speed > 0:
                    due = t0 + (i + chunk) / SAMPLE_RATE / speed  # only send audio a microphone would have
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await ws.send(msgpack.packb({"type": "Audio", "pcm": pcm[i:i + chunk].tolist()},
                                            use_single_float=True))
            await ws.send(msgpack.packb({"type": "Marker", "id": 1}))
            for i in range(0, tail.size, chunk):
                await ws.send(msgpack.packb({"type": "Audio", "pcm": tail[i:i + chunk].tolist()},
                                            use_single_float=True))

        sender = asyncio.create_task(send())
        try:
            async for raw in ws:
                m = msgpack.unpackb(raw)
                now = time.perf_counter() - t0
                if m["type"] == "Word":
                    res.words.append(m["text"])
                    sent_at = m["start_time"] / speed if speed > 0 else 0.0
                    res.word_latencies.append(now - sent_at)
                    if res.first_word_latency is None:
                        res.first_word_latency = now
                elif m["type"] == "EndWord":
                    res.end_latencies.append(now - (m["stop_time"] / speed if speed > 0 else 0.0))
                elif m["type"] == "Marker":
                    break
                elif m["type"] == "Error":
                    res.error = m["message"]
                    break
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
        res.wall_s = time.perf_counter() - t0
    return res


async def load_test(args) -> int:
    import torch

    refs = [open(p).read().strip() for p in args.refs] if args.refs else []
    audios = [load_audio(p) for p in args.files] if args.files else [
        synthetic_audio(args.seconds, i) for i in range(min(args.clients, 8))]
    scheduler = server = None
    stack = contextlib.AsyncExitStack()
    url, delay = args.url, args.delay_frames
    if url is None:
        from asr.engine.kyutai import from_pretrained, tiny_random
        from asr.engine.scheduler import EngineScheduler, SchedulerConfig
        from asr.serving.server import PATH, AsrServer

        tune = args.tune_convs
        loaded = (from_pretrained(args.model, args.clients, device=args.device, tune_convs=tune)
                  if args.model not in (None, "tiny-random") else tiny_random(args.clients, device=args.device,
                                                                              tune_convs=tune))
        print(f"in-process server: {loaded.name}, {args.clients} slots on {args.device}")
        scheduler = EngineScheduler(loaded, SchedulerConfig())
        server = AsrServer(scheduler)
        await stack.enter_async_context(scheduler)
        port = await stack.enter_async_context(server.serving())
        url, delay = f"ws://127.0.0.1:{port}{PATH}", loaded.asr_delay_frames
    mem: list[tuple[float, str]] = []
    t_start = time.perf_counter()

    async def sample_memory():
        while True:
            mem.append((time.perf_counter() - t_start, f"rss={rss_mib(args.server_pid):.0f}MiB{cuda_mib()}"))
            await asyncio.sleep(args.sample_every)

    sampler = asyncio.create_task(sample_memory())
    try:
        results = await asyncio.gather(*(run_client(url, args.api_key, audios[i % len(audios)], args.speed, delay)
                                         for i in range(args.clients)))
    finally:
        sampler.cancel()
        await stack.aclose()
    ok = [r for r in results if r.error is None]
    errors = [r.error for r in results if r.error]
    print(f"clients={args.clients} ok={len(ok)} errors={len(errors)} {errors[:3] if errors else ''}")
    if ok:
        rtf = [r.wall_s / r.audio_s for r in ok]
        fw = [r.first_word_latency for r in ok if r.first_word_latency is not None]
        wl = [x for r in ok for x in r.word_latencies]
        print(f"speed={f'{args.speed:g}x' if args.speed else 'max'}  RTF(wall/audio) mean={np.mean(rtf):.3f} max={np.max(rtf):.3f}")
        print(f"first-word latency s: p50={pct(fw, 50):.3f} p90={pct(fw, 90):.3f} (n={len(fw)})")
        el = [x for r in ok for x in r.end_latencies]
        print(f"per-word latency s (Word arrival - word start in audio): p50={pct(wl, 50):.3f} "
              f"p90={pct(wl, 90):.3f} p99={pct(wl, 99):.3f} (n={len(wl)})")
        print(f"end-of-word latency s (EndWord arrival - word end in audio): p50={pct(el, 50):.3f} "
              f"p90={pct(el, 90):.3f} p99={pct(el, 99):.3f} (n={len(el)})")
        lag = max(r.wall_s - r.audio_s for r in ok)  # the flush's answer after the audio's end
        print(f"lag after the audio's end (all words in): max={lag:.3f} s")
        if args.price_per_hour is not None:
            held = args.speed == 1.0 and not errors and lag <= args.max_lag
            why = ("run at --speed 1 to measure streams at real time" if args.speed != 1.0 else
                   f"{len(errors)} of {args.clients} streams failed" if errors else
                   f"the server fell behind (lag {lag:.3f} s > --max-lag {args.max_lag:g}): try fewer --clients")
            print(cost_line(args.price_per_hour, len(ok), held, why))
        if refs:
            from asr.wer import cer, wer

            hyps = [" ".join(ok[i].words) for i in range(min(len(ok), len(refs)))]
            print(f"WER={wer(refs[:len(hyps)], hyps):.3f} CER={cer(refs[:len(hyps)], hyps):.3f}")
    if scheduler is not None and scheduler.step_seconds:
        st = list(scheduler.step_seconds)
        rows = list(scheduler.active_rows)
        print(f"engine step ms: p50={pct(st, 50) * 1e3:.2f} p99={pct(st, 99) * 1e3:.2f} ticks={scheduler.ticks} "
              f"rows/step={np.mean(rows):.2f} all-{args.clients}={np.mean([r == args.clients for r in rows]):.2f}")
    print("memory over time:", ", ".join(f"{t:.0f}s {m}" for t, m in mem[:: max(1, len(mem) // 12)]))
    del torch
    return 0 if not errors else 1


# ---- in-process scheduler at real time -----------------------------------------------------
@dataclass
class SchedulerRun:
    """One `--scheduler` run of N conversations: what the tick loop did, and when Steps came."""

    n: int
    audio_s: float
    step_seconds: list[float]
    active_rows: list[int]
    frame_latencies: list[float]  # Step arrival - the moment its frame was due (paced runs only)

    @property
    def rtf(self) -> float:
        """Engine busy time over audio time, all N streams together: below 1 it keeps up."""
        return sum(self.step_seconds) / self.audio_s

    @property
    def all_active(self) -> float:
        return float(np.mean([r == self.n for r in self.active_rows])) if self.active_rows else float("nan")


async def _conversation(sched, pcm: np.ndarray, t0: float, offset: float, speed: float,
                        latencies: list[float]) -> None:
    """Feed whole frames as a microphone would deliver them, flush, and read until the last Step."""
    from asr.moshi_protocol import SAMPLE_RATE, Step

    session = await sched.open_session()
    frames = pcm.size // FRAME
    last_step = frames + sched.model.asr_delay_frames + sched.config.flush_extra_frames

    def due(k: int) -> float:  # when frame k (1-based) has been spoken
        return t0 + offset + k * FRAME / SAMPLE_RATE / speed

    async def read() -> None:
        while True:
            msgs = await session.messages()
            if not msgs:
                raise RuntimeError(f"session closed early: {session.closed_reason}")
            now = time.perf_counter()
            for m in msgs:
                if isinstance(m, Step):
                    if speed > 0 and m.step_idx <= frames:
                        latencies.append(now - due(m.step_idx))
                    if m.step_idx >= last_step:
                        return

    reader = asyncio.create_task(read())
    try:
        for k in range(1, frames + 1):
            if speed > 0:
                await asyncio.sleep(max(0.0, due(k) - time.perf_counter()))
            await session.feed(pcm[(k - 1) * FRAME:k * FRAME])
        await session.flush()
        await reader
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await session.close()


async def scheduler_run(n: int, seconds: float, speed: float = 1.0, phase: str = "spread",
                        device: str = "cpu", tune_convs: bool = True) -> SchedulerRun:
    """N conversations of `seconds` of synthetic audio through a fresh in-process scheduler on
    the tiny random engine. `phase`: `aligned` (every frame of every conversation is due at the
    same instants) or `spread` (conversation i starts i/N of a frame later, as callers who
    started at unrelated times do)."""
    from asr.engine.kyutai import tiny_random
    from asr.engine.scheduler import EngineScheduler, SchedulerConfig

    sched = EngineScheduler(tiny_random(n, device=device, tune_convs=tune_convs), SchedulerConfig())
    audios = [synthetic_audio(seconds, i) for i in range(n)]
    frame_s = FRAME / SAMPLE_RATE / speed if speed > 0 else 0.0
    latencies: list[float] = []
    async with sched:
        t0 = time.perf_counter()
        talks = asyncio.gather(*(
            _conversation(sched, audios[i], t0, (i / n) * frame_s if phase == "spread" else 0.0, speed, latencies)
            for i in range(n)))
        # a tick loop that dies would leave every conversation waiting for its Steps: fail instead
        ticking = sched._background_task
        await asyncio.wait({talks, ticking}, return_when=asyncio.FIRST_COMPLETED)
        if not talks.done():
            talks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await talks
            raise RuntimeError("the scheduler's tick loop ended") from ticking.exception()
        await talks
    return SchedulerRun(n=n, audio_s=(audios[0].size // FRAME) * FRAME / SAMPLE_RATE, step_seconds=list(sched.step_seconds),
                        active_rows=list(sched.active_rows), frame_latencies=latencies)


def scheduler_mode(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    pace = f"{args.speed:g}x real time" if args.speed > 0 else "as fast as possible"
    print(f"in-process EngineScheduler, tiny random engine on {args.device}, "
          f"torch threads={torch.get_num_threads()}: N conversations of {args.seconds:g} s of audio each "
          f"at {pace}, phase {args.phase}, fed in 80 ms frames")
    print(f"{'N':>3} {'ticks':>6} {'step p50 ms':>12} {'step p99 ms':>12} {'rows/step':>10} {'all-N':>6} "
          f"{'RTF':>6} {'frame lat p50 ms':>17} {'p99 ms':>8}")
    for n in args.sizes:
        r = asyncio.run(scheduler_run(n, args.seconds, args.speed, args.phase, args.device, args.tune_convs))
        st, lat = r.step_seconds, r.frame_latencies
        print(f"{n:>3} {len(st):>6} {pct(st, 50) * 1e3:>12.3f} {pct(st, 99) * 1e3:>12.3f} "
              f"{np.mean(r.active_rows):>10.2f} {r.all_active:>6.2f} {r.rtf:>6.3f} "
              f"{pct(lat, 50) * 1e3:>17.1f} {pct(lat, 99) * 1e3:>8.1f}", flush=True)
    print("rows/step: conversations stepped per tick (mean); all-N: fraction of ticks that stepped all N; "
          "RTF: engine busy s / audio s for all N together (< 1 keeps up); frame lat: Step arrival - frame due")
    return 0


# ---- engine throughput ---------------------------------------------------------------------
def engine_throughput(sizes: list[int], steps: int, threads: int | None, hidden: int, layers: int,
                      compile: bool = False, tune_convs: bool = True) -> int:
    import torch

    from asr.engine.kyutai import engine_from_hf, tiny_hf_model

    if threads:
        torch.set_num_threads(threads)
    hf = tiny_hf_model(seed=0, window=64, hidden=hidden, layers=layers)
    print(f"random engine on CPU: LM hidden={hidden} layers={layers} window=64, tiny Mimi; "
          f"torch threads={torch.get_num_threads()}, {steps} timed steps, "
          f"{'torch.compile' if compile else 'eager'}, Mimi convs {'tuned per layer' if tune_convs and not compile else 'oneDNN'}")

    def engine(B):
        e = engine_from_hf(hf, B, compile=compile, tune_convs=tune_convs)
        if e.conv_paths:
            print(f"  B={B} Mimi convs: {' '.join(p for p in e.conv_paths if p != 'pointwise')}")
        pcm = (np.random.default_rng(0).standard_normal((B, FRAME)) * 0.1).astype(np.float32)
        active = np.ones(B, bool)
        e.step(pcm, active, reset=list(range(B)))
        for _ in range(10):
            e.step(pcm, active)
        return e, pcm, active

    def time_round(e, pcm, active, n):
        t0 = time.perf_counter()
        for _ in range(n):
            e.step(pcm, active)
        total = (time.perf_counter() - t0) / n
        if compile:  # the compiled step fuses Mimi into the rest: no separate figure
            return total, float("nan")
        with torch.no_grad():  # the Mimi front end alone (its convs run at the 24 kHz sample rate)
            t0 = time.perf_counter()
            for _ in range(n):
                e.mimi.step(e.pcm, e.active)
            return total, (time.perf_counter() - t0) / n

    # Every engine is timed in each of `rounds` interleaved rounds and each gets the median of
    # its rounds: on a shared, noisy machine a slow spell then hits all batch sizes alike
    # instead of whichever one was being timed (sequential timing moved the B=16 ratio by 0.1).
    engines = {B: engine(B) for B in dict.fromkeys([1, *sizes])}
    rounds = max(1, min(10, steps // 20))
    per_round = max(1, steps // rounds)
    rows: dict[int, list[tuple[float, float]]] = {B: [] for B in engines}
    for _ in range(rounds):
        for B, (e, pcm, active) in engines.items():
            rows[B].append(time_round(e, pcm, active, per_round))
    med = {B: (float(np.median([r[0] for r in rs])), float(np.median([r[1] for r in rs]))) for B, rs in rows.items()}
    single, single_mimi = med[1]
    # B sequential single-stream runs of `steps` frames each take B * steps * single seconds, so
    # their throughput is 1 / single frames per second whatever B is.
    print(f"{rounds} interleaved rounds of {per_round} steps per engine, median round")
    print(f"single stream: step {single * 1e3:.3f} ms (Mimi {single_mimi * 1e3:.3f} ms) = {1 / single:.0f} frames/s")
    print(f"{'B':>3} {'step ms':>8} {'Mimi ms':>8} {'batched fr/s':>13} {'sequential fr/s':>16} {'ratio':>6} "
          f"{'ratio/B':>8} {'LM-only ratio/B':>16}")
    for B in sizes:
        t_b, m_b = med[B]
        ratio = (B / t_b) / (1 / single)
        lm_ratio = (B / max(t_b - m_b, 1e-9)) / (1 / max(single - single_mimi, 1e-9))  # nan if compiled
        print(f"{B:>3} {t_b * 1e3:>8.3f} {m_b * 1e3:>8.3f} {B / t_b:>13.0f} {1 / single:>16.0f} {ratio:>6.2f} "
              f"{ratio / B:>8.2f} {lm_ratio / B:>16.2f}")
    return 0


# ---- memory --------------------------------------------------------------------------------
def memory_hour(steps: int, every: int) -> list[tuple[int, float]]:
    import torch

    from asr.engine.kyutai import engine_from_hf, tiny_hf_model

    torch.set_num_threads(1)
    # tuned convs, as `duplex asr-serve` runs by default on CPU (the C kernel where it wins)
    engine = engine_from_hf(tiny_hf_model(seed=0, window=8, layers=1, codebooks=2, hidden=16), 1, tune_convs=True)
    print(f"  Mimi convs: {' '.join(engine.conv_paths)}")
    noise = (np.random.default_rng(0).standard_normal((64, 1, FRAME)) * 0.3).astype(np.float32)
    active = np.ones(1, bool)
    engine.step(noise[0], active, reset=[0])
    out = []
    for i in range(1, steps + 1):
        engine.step(noise[i % 64], active)
        if i % every == 0:
            out.append((i, rss_mib()))
    return out


async def memory_flood(audio_seconds: float, speed: float) -> list[tuple[float, float, int]]:
    """In-process server, one client at `speed` x real time: (t, RSS MiB, server-buffered samples)."""
    import msgpack
    import websockets

    from asr.engine.kyutai import tiny_random
    from asr.engine.scheduler import EngineScheduler, SchedulerConfig
    from asr.serving.server import PATH, AsrServer

    sched = EngineScheduler(tiny_random(2, tune_convs=True), SchedulerConfig())
    out = []
    async with sched, AsrServer(sched).serving() as port:
        async with websockets.connect(f"ws://127.0.0.1:{port}{PATH}",
                                      additional_headers={"kyutai-api-key": "public_token"}, close_timeout=1) as ws:
            await ws.recv()
            session = sched.sessions[0]
            chunk = msgpack.packb({"type": "Audio", "pcm": synthetic_audio(1.0, 0).tolist()}, use_single_float=True)
            t0 = time.perf_counter()

            async def drain():
                async for _ in ws:
                    pass

            drainer = asyncio.create_task(drain())
            for i in range(int(audio_seconds)):
                if speed > 0:
                    await asyncio.sleep(max(0.0, t0 + i / speed - time.perf_counter()))
                await ws.send(chunk)  # at speed 0 this waits whenever the server stops reading
                if i % max(1, int(audio_seconds) // 20) == 0:
                    out.append((time.perf_counter() - t0, rss_mib(), session.buffered_samples))
            drainer.cancel()
    return out


def memory_mode(args) -> int:
    print(f"1-hour synthetic stream: {args.memory_steps} engine steps (tiny random engine, CPU)")
    t0 = time.perf_counter()
    samples = memory_hour(args.memory_steps, max(1, args.memory_steps // 15))
    base = samples[0][1]
    print("  step: RSS MiB  " + ", ".join(f"{i}: {r:.1f}" for i, r in samples))
    print(f"  growth after first sample: {samples[-1][1] - base:+.2f} MiB (max {max(r for _, r in samples) - base:+.2f})"
          f" in {time.perf_counter() - t0:.0f}s")
    pace = f"{args.flood_speed:g}x real time" if args.flood_speed > 0 else "as fast as it can send"
    print(f"client at {pace}, {args.flood_seconds:g}s of audio, in-process server:")
    flood = asyncio.run(memory_flood(args.flood_seconds, args.flood_speed))
    base = flood[min(2, len(flood) - 1)][1]
    print("  t s: RSS MiB / buffered samples  " + ", ".join(f"{t:.0f}: {r:.1f}/{b}" for t, r, b in flood))
    print(f"  RSS growth after warm-up: {flood[-1][1] - base:+.2f} MiB (max {max(r for _, r, _ in flood) - base:+.2f});"
          f" max buffered {max(b for *_, b in flood)} samples (cap {10 * SAMPLE_RATE})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="duplex asr-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="ws://host:port/api/asr-streaming (default: in-process server)")
    p.add_argument("--api-key", default="public_token")
    p.add_argument("--model", default=None,
                   help="in-process server: a Kyutai STT checkpoint (hub id or dir), or tiny-random (the default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--speed", type=float, default=1.0, help="x real time; 0 = as fast as possible")
    p.add_argument("--files", nargs="*", help="audio files (any rate, mixed to mono, resampled to 24 kHz)")
    p.add_argument("--refs", nargs="*", help="reference transcripts (text files), same order as --files")
    p.add_argument("--seconds", type=float, default=10.0, help="synthetic audio length without --files")
    p.add_argument("--delay-frames", type=int, default=31, help="remote server's ASR delay, for flushing")
    p.add_argument("--server-pid", type=int, default=None, help="remote server pid on this host, for RSS")
    p.add_argument("--sample-every", type=float, default=1.0)
    p.add_argument("--price-per-hour", type=float, default=None, metavar="DOLLARS",
                   help="what the recognizer's device costs an hour: also print the cost per stream-hour "
                        "(the price shared by --clients streams, if all held real time: see --max-lag)")
    p.add_argument("--max-lag", type=float, default=MAX_LAG_S, metavar="S",
                   help="--price-per-hour: a stream held real time if its last words came within S seconds "
                        f"of its audio's end (default {MAX_LAG_S:g}; use audio of a minute or so, so that a "
                        "server falling behind shows)")
    p.add_argument("--engine-throughput", action="store_true")
    p.add_argument("--sizes", type=int, nargs="*", default=[1, 4, 16], help="--engine-throughput, --scheduler: N")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--hidden", type=int, default=32, help="--engine-throughput: LM width")
    p.add_argument("--layers", type=int, default=2, help="--engine-throughput: LM layers")
    p.add_argument("--compile", action="store_true", help="--engine-throughput: torch.compile the step")
    p.add_argument("--no-tune-convs", dest="tune_convs", action="store_false",
                   help="oneDNN for every Mimi conv of the engine (default, as asr-serve does: each conv's "
                        "path, the SEANet C kernel among them, is timed per layer at start-up on CPU)")
    p.add_argument("--scheduler", action="store_true",
                   help="N conversations (each N of --sizes) through the in-process EngineScheduler at --speed, "
                        "--seconds of audio each: step time, rows per step, RTF, frame latency")
    p.add_argument("--phase", choices=["spread", "aligned"], default="spread",
                   help="--scheduler: conversations' frames spread over a frame period (independent callers) "
                        "or all due at the same instants")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--memory-steps", type=int, default=45_000)
    p.add_argument("--flood-seconds", type=float, default=600.0)
    p.add_argument("--flood-speed", type=float, default=10.0,
                   help="x real time for --memory's client; 0 = as fast as the server reads (backpressure)")
    args = p.parse_args(argv)
    if args.price_per_hour is not None:
        if args.engine_throughput or args.memory or args.scheduler:
            p.error("--price-per-hour prices the streams of the load client (no --engine-throughput, "
                    "--memory or --scheduler)")
        if args.price_per_hour <= 0:
            p.error(f"--price-per-hour must be above 0, not {args.price_per_hour:g}")
    if args.engine_throughput:
        return engine_throughput(args.sizes, args.steps, args.threads, args.hidden, args.layers, args.compile,
                             args.tune_convs)
    if args.memory:
        return memory_mode(args)
    if args.scheduler:
        return scheduler_mode(args)
    return asyncio.run(load_test(args))


if __name__ == "__main__":
    raise SystemExit(main())
