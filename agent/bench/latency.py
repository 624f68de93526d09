"""`duplex bench latency`: voice-to-voice latency, concurrent vs waterfall, same models, same audio.

A scripted conversation (questions spoken by flite at run time, plus real clips from
`../shared/speech/dev`) is replayed at real-time pace through the WAV transport into a `Session`,
once with `mode="concurrent"` and once with `mode="waterfall"`, with the same loaded models.

Voice-to-voice for a turn = first bot audio sent to the transport (`TurnRecord.first_audio_out`)
minus the exact end of user speech. The end of speech is read from the input file, not estimated
by the VAD: the last sample whose smoothed |x| exceeds 1% of full scale, placed on the transport's
timeline (`input_start_times[i] + offset`) and mapped to the monotonic clock as `t0 + timeline_s`.

It also reports the per-stage breakdown (endpoint wait, ASR final, LLM first token, TTS first
chunk, then the wait until the first audio went out; `agent.tracing.stages.breakdown`, the same function
as the session's records and `duplex trace report`), the asyncio event-loop lag seen by a 10 ms
ticker, and speculation figures when the session exposes `speculation_stats`.
Figures measured on a shared CPU are noisy; the JSON keeps every per-turn number.
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
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.conversation.endpointing import DEFAULT_POLICY, POLICIES, policy_named
from agent.tracing.stages import STAGE_KEYS, breakdown
from agent.workers import run_in
from asr.base import SPEECH_RATE
from llm import bundled
from tts.base import known_text

ASR_RATE = SPEECH_RATE  # the clips are made at the rate the recognizer hears
LEAD_S = 0.5  # silence before each input, so the VAD pre-roll holds audio before the speech
END_THRESHOLD = 0.01  # of full scale
END_SMOOTH_S = 0.005  # centered moving-average window of |x| before thresholding
LAG_TICK_S = 0.010

# Things people ask a voice assistant, short facts and requests that take a few sentences.
# Spoken by flite (voice slt) at run time.
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Can you explain how a rainbow forms?",
    "Tell me a short story about a cat.",
    "What are some tips for sleeping better?",
    "Why is the sky blue?",
    "What should I cook for dinner tonight?",
]
# Real recordings from ../shared/speech/dev, single utterances with no long internal pause.
DEV_CLIPS = ["goforward.wav", "sense_and_sensibility_01_austen_64kb-0880.wav", "cards_005.wav"]


def default_dev_dir() -> Path:
    """`shared/speech/dev` in the directory next to the repository root (as tests/helpers.py)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "speech" / "dev"


def speech_end_offset(pcm: np.ndarray, rate: int, threshold: float = END_THRESHOLD,
                      smooth_s: float = END_SMOOTH_S) -> float | None:
    """Seconds from the start of `pcm` to the end of its last sample above `threshold` (after a
    centered moving average of |x| over `smooth_s`); None when nothing exceeds it."""
    x = np.abs(np.asarray(pcm, dtype=np.float32).reshape(-1))
    w = max(1, int(round(smooth_s * rate)))
    env = np.convolve(x, np.ones(w, dtype=np.float32) / w, mode="same")
    loud = np.flatnonzero(env > threshold)
    return None if loud.size == 0 else float(loud[-1] + 1) / rate


# ---- the scripted conversation -------------------------------------------------------------
@dataclass
class ScriptLine:
    name: str
    text: str  # what is said (flite text, or the dev clip's reference transcript)
    pcm: np.ndarray  # float32 mono, 16 kHz, with LEAD_S of silence first
    speech_end_s: float  # offset of the exact end of speech inside `pcm`


def _flite(text: str, path: Path) -> np.ndarray:
    import soundfile as sf

    from transport.audio import resample

    subprocess.run(["flite", "-voice", "slt", "-t", text, "-o", str(path)], check=True,
                   capture_output=True)
    data, rate = sf.read(path, dtype="float32", always_2d=True)
    return resample(data.mean(axis=1), int(rate), ASR_RATE)


def _dev_clip(path: Path) -> np.ndarray:
    import soundfile as sf

    from transport.audio import resample

    data, rate = sf.read(path, dtype="float32", always_2d=True)
    return resample(data.mean(axis=1), int(rate), ASR_RATE)


def _dev_transcripts(dev_dir: Path) -> dict[str, str]:
    tsv = dev_dir / "transcripts.tsv"
    if not tsv.exists():
        return {}
    rows = (line.split("\t", 1) for line in tsv.read_text().splitlines() if "\t" in line)
    return {name: text.strip() for name, text in rows}


def build_script(work_dir: Path, dev_dir: Path, n_turns: int | None = None) -> list[ScriptLine]:
    """Two flite questions, then a dev clip, and so on; cut to `n_turns` when given."""
    if shutil.which("flite") is None:
        raise RuntimeError("flite is not installed (apt-get install flite)")
    missing = [c for c in DEV_CLIPS if not (dev_dir / c).exists()]
    if missing:
        raise RuntimeError(f"dev clips not found in {dev_dir}: {', '.join(missing)} (use --dev-dir)")
    order: list[tuple[str, str]] = []
    qi = di = 0
    while qi < len(QUESTIONS) or di < len(DEV_CLIPS):
        if (len(order) % 3 == 2 and di < len(DEV_CLIPS)) or qi >= len(QUESTIONS):
            order.append(("dev", DEV_CLIPS[di]))
            di += 1
        else:
            order.append(("flite", QUESTIONS[qi]))
            qi += 1
    if n_turns is not None:
        order = order[:n_turns]
    transcripts = _dev_transcripts(dev_dir)
    lead = np.zeros(int(LEAD_S * ASR_RATE), dtype=np.float32)
    lines = []
    for i, (kind, item) in enumerate(order):
        if kind == "flite":
            pcm, name, text = _flite(item, work_dir / f"q{i}.wav"), f"q{i}:flite", item
        else:
            pcm, name, text = _dev_clip(dev_dir / item), f"q{i}:{item}", transcripts.get(item, "")
        pcm = np.concatenate([lead, pcm.astype(np.float32)])
        end = speech_end_offset(pcm, ASR_RATE)
        if end is None:
            raise RuntimeError(f"{name}: no speech above {END_THRESHOLD} of full scale")
        lines.append(ScriptLine(name, text, pcm, end))
    return lines


# ---- measurement helpers ---------------------------------------------------------------------
class LoopLagMonitor:
    """Sleeps `tick_s` in a loop on the event loop and records how late each wake-up was."""

    def __init__(self, tick_s: float = LAG_TICK_S, max_samples: int = 360_000):
        self.tick_s = tick_s
        self.lags_ms: deque[float] = deque(maxlen=max_samples)  # 1 h of ticks at most

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t - self.tick_s) * 1000))

    def stats(self) -> dict:
        if not self.lags_ms:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        a = np.asarray(self.lags_ms)
        return {"samples": int(a.size), "p50_ms": round(float(np.percentile(a, 50)), 2),
                "p99_ms": round(float(np.percentile(a, 99)), 2), "max_ms": round(float(a.max()), 2)}


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _mean(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return round(float(np.mean(v)), 1) if v else None


def speculation_figures(session) -> dict | None:
    """`session.speculation_stats` as a dict (attribute, property or method), or None if absent."""
    stats = getattr(session, "speculation_stats", None)
    if callable(stats):
        stats = stats()
    if not isinstance(stats, dict):
        return None
    out = dict(stats)
    if "hit_rate" not in out:
        hits = out.get("hits", out.get("commits"))
        total = out.get("attempts", out.get("started", out.get("branches")))
        if isinstance(hits, (int, float)) and isinstance(total, (int, float)) and total:
            out["hit_rate"] = round(hits / total, 3)
    return out


def match_turns(script: list[ScriptLine], starts: list[float], t0: float, records) -> list[dict]:
    """One row per input: the session record whose (VAD) speech end falls in that input's window
    and lies closest to the exact end; its stage breakdown (`agent.tracing.stages.breakdown`) measured
    from the exact end instead of the VAD's."""
    rows = []
    for i, line in enumerate(script):
        row = {"turn": i, "input": line.name, "said": line.text, "records": 0}
        if i >= len(starts):
            rows.append({**row, "voice_to_voice_ms": None, "note": "input never played"})
            continue
        exact_end = t0 + starts[i] + line.speech_end_s
        lo = t0 + starts[i]
        hi = t0 + starts[i + 1] if i + 1 < len(starts) else float("inf")
        mine = [r for r in records if lo <= r.speech_end < hi]
        row["records"] = len(mine)
        row["exact_speech_end_s"] = round(starts[i] + line.speech_end_s, 3)  # on the timeline
        if not mine:
            rows.append({**row, "voice_to_voice_ms": None, "note": "no end of turn detected"})
            continue
        r = min(mine, key=lambda r: abs(r.speech_end - exact_end))
        rows.append({
            **row,
            "heard": r.user_text, "reply": r.reply_text,
            "vad_end_error_ms": round((r.speech_end - exact_end) * 1000, 1),
            **breakdown(exact_end, r.endpoint, r.asr_final, r.llm_first_token, r.tts_first_chunk,
                        r.first_audio_out),
            "record": r.summary(),
        })
    return rows


# ---- one mode -------------------------------------------------------------------------------
async def run_mode(models, script: list[ScriptLine], mode: str, args, out_wav: Path) -> dict:
    """`mode` is a session mode, optionally with "+trace" to record a full trace meanwhile
    (for measuring what tracing costs end to end)."""
    from agent.conversation.session import Session, SessionConfig
    from agent.tracing.trace import Tracer
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    label = mode
    mode, _, extra = mode.partition("+")
    tracer = Tracer(f"bench-{label}", capacity=1 << 18) if extra == "trace" else None

    turns = [ScriptedTurn(line.pcm, ASR_RATE, line.name) for line in script]
    transport = WavConversationTransport(turns, models.tts.sample_rate, str(out_wav), gap_s=args.gap,
                                         reply_timeout_s=args.reply_timeout)
    cfg = SessionConfig(mode=mode, max_tokens=args.max_tokens, first_chunk_words=args.first_chunk_words)
    cfg.turns.endpointing = policy_named(args.endpointing)
    if args.system_prompt:
        cfg.system_prompt = args.system_prompt
    session = Session(models, transport, cfg, tracer=tracer, session_id=f"bench-{label}")
    monitor = LoopLagMonitor()
    lag_task = asyncio.create_task(monitor.run(), name="loop-lag")
    t = time.perf_counter()
    try:
        await session.run()
    finally:
        lag_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag_task
        transport.close()
    wall_s = time.perf_counter() - t
    if tracer is not None and args.work_dir is not None:
        from agent.tracing.export import write_jsonl

        print(f"trace of {label}: {write_jsonl(tracer, str(args.work_dir / f'trace-{mode}.jsonl'))}")
    rows = match_turns(script, list(transport.input_start_times), transport.t0, session.records)
    v2v = [r["voice_to_voice_ms"] for r in rows if r["voice_to_voice_ms"] is not None]
    return {
        "mode": label, "traced_events": tracer.total if tracer is not None else 0, "turns": rows, "replied": len(v2v), "inputs": len(rows),
        "session_records": len(session.records), "wall_s": round(wall_s, 1),
        "voice_to_voice_p50_ms": _pct(v2v, 50), "voice_to_voice_p90_ms": _pct(v2v, 90),
        "stages_mean_ms": {k: _mean([r.get(k) for r in rows]) for k in (*STAGE_KEYS, "vad_end_error_ms")},
        "loop_lag": monitor.stats(), "speculation": speculation_figures(session),
        "output_wav": str(out_wav),
    }


async def warm_up(models) -> None:
    """One small call to each model so that the first mode does not pay the cold start alone."""
    stream = await models.asr.open_stream()
    try:
        await stream.feed(np.zeros(stream.sample_rate, dtype=np.float32))
        await stream.flush(1.0)
    finally:
        await stream.close()
    messages = [{"role": "system", "content": "Answer in one short English sentence."},
                {"role": "user", "content": "Hello?"}]
    async with contextlib.aclosing(models.llm.stream(messages, 4)) as toks:
        async for _ in toks:
            pass

    async with contextlib.aclosing(models.tts.stream(known_text("Hello there."))) as chunks:
        async for _ in chunks:
            pass
    vad = models.vad_factory()
    await run_in("vad", vad, np.zeros(ASR_RATE, dtype=np.float32))


# ---- report -------------------------------------------------------------------------------
def _fmt(v, width: int = 7) -> str:
    return f"{v:>{width}.0f}" if isinstance(v, (int, float)) else f"{'-':>{width}}"


def print_mode(res: dict, out=None) -> None:
    p = lambda *a: print(*a, file=out or sys.stdout)  # noqa: E731
    p(f"\n== {res['mode']} ==  ({res['replied']}/{res['inputs']} turns replied, "
      f"{res['session_records']} session turns, {res['wall_s']} s)")
    p(f"{'turn':<4} {'input':<24} {'endpt':>7} {'asr':>7} {'ttft':>7} {'tts1':>7} {'send':>7} "
      f"{'v2v ms':>7}  heard -> reply")
    for r in res["turns"]:
        text = f"{r.get('heard', '')!r} -> {r.get('reply', '')[:50]!r}" if "heard" in r else r.get("note", "")
        extra = f" [{r['records']} session turns]" if r["records"] > 1 else ""
        p(f"{r['turn']:<4} {r['input'][:24]:<24} " + " ".join(_fmt(r.get(k)) for k in STAGE_KEYS)
          + f" {_fmt(r['voice_to_voice_ms'])}  {text}{extra}")
    s = res["stages_mean_ms"]
    p(f"mean {'':<24} " + " ".join(_fmt(s[k]) for k in STAGE_KEYS)
      + f"          (VAD end error {_fmt(s['vad_end_error_ms'], 0)} ms)")
    p(f"voice-to-voice p50 {_fmt(res['voice_to_voice_p50_ms'], 0)} ms  "
      f"p90 {_fmt(res['voice_to_voice_p90_ms'], 0)} ms")
    lag = res["loop_lag"]
    p(f"event-loop lag (10 ms ticker, {lag['samples']} ticks): p50 {lag['p50_ms']} ms  "
      f"p99 {lag['p99_ms']} ms  max {lag['max_ms']} ms")
    spec = res["speculation"]
    if spec is None:
        p("speculation: hit rate n/a, wasted work n/a")
    else:
        p(f"speculation: hit rate {spec.get('hit_rate', 'n/a')}; "
          + ", ".join(f"{k}={v}" for k, v in spec.items() if k != "hit_rate"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from agent.serving.cli import positive_int

    p = argparse.ArgumentParser(prog="duplex bench latency", description=__doc__.split("\n")[0])
    p.add_argument("--asr", default="whisper-tiny.en")
    p.add_argument("--llm", default=bundled.DEFAULT,
                   help=f"{bundled.names_help()} | path.gguf | http://host:port/v1")
    p.add_argument("--llm-model", default=None, help="model name at an OpenAI-compatible --llm URL")
    p.add_argument("--tts", default="piper", help="piper | voice.onnx | espeak-ng | flite")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--endpointing", choices=list(POLICIES), default=DEFAULT_POLICY,
                   help="end-of-turn policy, as duplex serve's --endpointing")
    p.add_argument("--first-chunk-words", type=positive_int, default=2,
                   help="words of the reply's first TTS chunk (fewer: first audio sooner, one more join)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="LLM sampling temperature; greedy by default, so that both modes answer the same "
                        "transcript with the same words and the comparison measures the orchestration")
    p.add_argument("--turns", type=int, default=None,
                   help=f"use only the first N user turns (default all {len(QUESTIONS) + len(DEV_CLIPS)})")
    p.add_argument("--dev-dir", type=Path, default=None, help="directory of the dev clips (default ../shared/speech/dev)")
    p.add_argument("--modes", default="concurrent,waterfall",
                   help="comma-separated, run in this order; MODE+trace also records a full trace (its cost)")
    p.add_argument("--gap", type=float, default=1.0, help="silence after a reply before the next input (s)")
    p.add_argument("--reply-timeout", type=float, default=30.0)
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up call to each model")
    p.add_argument("--work-dir", type=Path, default=None, help="keep the inputs and bot WAVs here")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="write all figures to this JSON file")
    args = p.parse_args(argv)
    if args.turns is not None and args.turns < 1:
        p.error("--turns must be at least 1")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m.removesuffix("+trace") not in ("concurrent", "waterfall") for m in args.modes):
        p.error("--modes takes concurrent and/or waterfall, each optionally with +trace")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from agent.conversation.models import ModelChoice, load_models

    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-latency-")))
        work.mkdir(parents=True, exist_ok=True)
        script = build_script(work, args.dev_dir or default_dev_dir(), args.turns)
        t = time.perf_counter()
        models = load_models(ModelChoice(asr=args.asr, llm=args.llm, llm_model=args.llm_model, tts=args.tts,
                                         endpointing=policy_named(args.endpointing)))
        load_s = time.perf_counter() - t
        if hasattr(models.llm, "temperature"):
            models.llm.temperature = args.temperature
        if not args.no_warmup:
            asyncio.run(warm_up(models))
        print(f"duplex bench latency: {len(script)} user turns "
              f"({sum(':flite' in s.name for s in script)} flite, {sum(':flite' not in s.name for s in script)} dev clips), "
              f"asr={args.asr} llm={args.llm} tts={models.tts.name}, models loaded in {load_s:.1f} s; "
              f"{os.cpu_count()} CPUs (shared: figures are noisy)")
        print("stages (ms): endpt = endpoint - exact speech end, asr = final transcript - endpoint, "
              "ttft = LLM first token - final, tts1 = first TTS chunk - first token, "
              "send = first audio out - first chunk; v2v = first audio out - exact speech end; "
              "a milestone a speculative reply reached early counts 0")
        results = {}
        for mode in args.modes:
            results[mode] = asyncio.run(run_mode(models, script, mode, args, work / f"bot_{mode}.wav"))
            print_mode(results[mode])
        # an untraced run of a mode if there is one, else its traced run
        c = results.get("concurrent") or results.get("concurrent+trace")
        w = results.get("waterfall") or results.get("waterfall+trace")
        ratio = None
        if c and w and c["voice_to_voice_p50_ms"] and w["voice_to_voice_p50_ms"]:
            ratio = round(c["voice_to_voice_p50_ms"] / w["voice_to_voice_p50_ms"], 3)
        print("\nvoice-to-voice p50: " + ", ".join(f"{m} {_fmt(r['voice_to_voice_p50_ms'], 0)} ms"
                                                for m, r in results.items())
              + f"; ratio concurrent/waterfall = {ratio if ratio is not None else 'n/a'}")
        if c and w:
            same = sum(bool(a.get("reply")) and a.get("reply") == b.get("reply") for a, b in zip(c["turns"], w["turns"]))
            print(f"same reply in both modes: {same}/{len(c['turns'])} turns")
        for m, r in results.items():
            plain = results.get(m.removesuffix("+trace"))
            if m.endswith("+trace") and plain and plain["voice_to_voice_p50_ms"] and r["voice_to_voice_p50_ms"]:
                print(f"tracing cost: {m} p50 {r['voice_to_voice_p50_ms']:.0f} ms vs untraced "
                      f"{plain['voice_to_voice_p50_ms']:.0f} ms ({r['voice_to_voice_p50_ms'] - plain['voice_to_voice_p50_ms']:+.0f} ms), "
                      f"{r['traced_events']} events recorded")
        report = {
            "config": {"asr": args.asr, "llm": args.llm, "tts": models.tts.name, "max_tokens": args.max_tokens,
                       "first_chunk_words": args.first_chunk_words, "temperature": args.temperature,
                       "gap_s": args.gap, "turns": len(script), "cpus": os.cpu_count(),
                       "warmup": not args.no_warmup, "models_load_s": round(load_s, 1),
                       "end_threshold": END_THRESHOLD, "end_smooth_s": END_SMOOTH_S},
            "script": [{"input": s.name, "said": s.text, "speech_end_offset_s": round(s.speech_end_s, 4),
                        "duration_s": round(s.pcm.size / ASR_RATE, 3)} for s in script],
            "modes": results,
            "ratio_p50_concurrent_over_waterfall": ratio,
        }
        if args.json_out:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(report, indent=2))
            print(f"figures written to {args.json_out}")
    return 0 if all(r["replied"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
