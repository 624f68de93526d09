"""Accuracy against latency of the embedded Whisper's decode settings, in one table.

For each setting (compute type, beam size, encoder window) it measures:
- dev WER: the final decode of every clip in `../shared/speech/dev` (transcripts.tsv), scored
  with `asr.wer` (the normalisation of tests/test_asr_wer.py);
- flite questions (voice slt, resampled to 16 kHz as tests/helpers.py `say` does): how many of
  `--repeats` decodes of "Why is the sky blue?" are right, and of all the questions together.
  Repeat i puts i x 60 ms more silence before the WAV (flite's own lead-in is ~0.23 s; the
  conversation hands the recogniser 0.3 s before the VAD's speech start): repeat 0 is the WAV
  as flite wrote it, the others are where a conversation's utterance might start;
- the decode time of a final, `UtteranceDecoder.decode` (whole utterance, word timestamps: what
  the conversation waits for at the end of a turn), p50/p90 over the dev clips x `--rounds`,
  and the median paired difference from the default on the same clip in the same round;
  also the p50 on the (shorter, 1.5-4 s) flite questions, and of a partial (no word times) on
  the dev clips (first round only). The flite decodes are paired with default's the same way.
"right" is the whole question, word for word after normalisation (fWER: the questions' WER).
Decodes are timed interleaved, round-robin per clip across the settings (their order rotated
from clip to clip), because the machine is shared and noisy. Models of one compute type are
loaded once and shared by its settings.

    .venv/bin/python scripts/whisper_settings.py [--rounds 1] [--repeats 6] [--only NAME ...] [-v]

~5 minutes on two idle cores (the three 30 s-window settings take half of it); `--only` runs
some of them (names as printed) beside today's default.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from asr.base import SPEECH_RATE  # noqa: E402
from asr.wer import normalize, wer  # noqa: E402
from asr.whisper import WhisperOptions, WhisperRecognizer  # noqa: E402
from helpers import DEV, say  # noqa: E402

QUESTIONS = [
    "Why is the sky blue?", "What is the capital of France?", "How many legs does a spider have?",
    "Can you explain how a rainbow forms?", "Tell me a story.", "What should I cook for dinner tonight?",
    "Please tell me a long story about a brave little dragon.", "Stop, stop. Wait a moment please.",
]
SKY = QUESTIONS[0]
LEAD_STEP_S = 0.06


@dataclass
class Setting:
    name: str
    compute_type: str = "int8"
    beam_size: int = 1
    window_pad_s: float | None = 10.0
    # filled in by the run
    dev_hyps: list[str] = field(default_factory=list)
    final_ms: list[float] = field(default_factory=list)
    paired_ms: list[float] = field(default_factory=list)
    partial_ms: list[float] = field(default_factory=list)
    flite_ms: list[float] = field(default_factory=list)
    flite_paired_ms: list[float] = field(default_factory=list)
    flite_right: dict[str, int] = field(default_factory=dict)
    flite_wrong: dict[str, set] = field(default_factory=dict)
    flite_refs: list[str] = field(default_factory=list)
    flite_hyps: list[str] = field(default_factory=list)
    unstable: int = 0  # dev clips whose text changed from round to round

    def options(self) -> WhisperOptions:
        # the window is the final's (what the table times); partials keep the default's
        full = self.window_pad_s is None  # None: Whisper's own 30 s window, as 30 s of padding gives
        return WhisperOptions(final_beam_size=self.beam_size, final_window_pad_s=30.0 if full else self.window_pad_s)

    @property
    def window(self) -> str:
        return "30 s" if self.window_pad_s is None else f"+{self.window_pad_s:g} s"


def today() -> Setting:
    """The defaults `load_recognizer()` uses (WhisperOptions() and WhisperRecognizer.load)."""
    import inspect

    o = WhisperOptions()
    ct = inspect.signature(WhisperRecognizer.load).parameters["compute_type"].default
    return Setting("default", ct, o.final_beam_size,
                   o.window_pad_s if o.final_window_pad_s is None else o.final_window_pad_s)


def settings() -> list[Setting]:
    base = today()
    grid = [
        ("int8", 1, 10.0), ("int8", 2, 10.0), ("int8", 3, 10.0), ("int8", 4, 10.0), ("int8", 5, 10.0),
        ("int8", 5, 15.0), ("int8", 5, 20.0), ("int8", 1, None), ("int8", 5, None),
        ("float32", 1, 10.0), ("float32", 5, 10.0), ("float32", 5, None),
    ]
    out = [base]
    for ct, beam, pad in grid:
        if (ct, beam, pad) != (base.compute_type, base.beam_size, base.window_pad_s):
            pad_name = "full" if pad is None else f"pad{pad:g}"
            out.append(Setting(f"{ct}-b{beam}-{pad_name}", ct, beam, pad))
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def right(ref: str, hyp: str) -> bool:
    return normalize(ref) == normalize(hyp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="timed passes over the dev clips")
    ap.add_argument("--repeats", type=int, default=6, help="decodes of each flite question")
    ap.add_argument("--threads", type=int, default=0, help="CTranslate2 threads (default: as load_recognizer)")
    ap.add_argument("--only", nargs="*", help="setting names to run (default: all); 'default' is always run")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every wrong hypothesis")
    args = ap.parse_args(argv)

    runs = settings()
    if args.only:
        runs = [s for s in runs if s.name == "default" or s.name in args.only]
    lines = [ln.split("\t") for ln in (DEV / "transcripts.tsv").read_text().splitlines() if ln.strip()]
    dev = []
    for name, ref in lines:
        audio, rate = sf.read(DEV / name, dtype="float32")
        assert rate == SPEECH_RATE, name
        dev.append((name, ref, audio))
    with tempfile.TemporaryDirectory() as tmp:
        spoken = {q: say(q, Path(tmp) / f"q{i}.wav") for i, q in enumerate(QUESTIONS)}

    models: dict[str, object] = {}
    recs = {}
    for s in runs:
        if s.compute_type not in models:
            models[s.compute_type] = WhisperRecognizer.load(compute_type=s.compute_type, cpu_threads=args.threads).model
        recs[s.name] = WhisperRecognizer(models[s.compute_type], s.options(), name=s.name)

    def final(s: Setting, audio: np.ndarray) -> tuple[str, float]:
        dec = recs[s.name].open_decoder()
        dec.push(audio)
        t = time.perf_counter()
        text = dec.decode().text
        return text, (time.perf_counter() - t) * 1000

    def partial(s: Setting, audio: np.ndarray) -> float:
        dec = recs[s.name].open_decoder()
        dec.push(audio)
        t = time.perf_counter()
        dec.partial(force=True)
        return (time.perf_counter() - t) * 1000

    t0 = time.perf_counter()
    for s in runs:  # warm-up: first calls allocate
        final(s, dev[0][2])
    k = 0
    for rnd in range(args.rounds):
        for c, (_, _, audio) in enumerate(dev):
            order = runs[k % len(runs):] + runs[:k % len(runs)]
            k += 1
            times = {}
            for s in order:
                text, ms = final(s, audio)
                times[s.name] = ms
                s.final_ms.append(ms)
                if rnd == 0:
                    s.dev_hyps.append(text)
                elif text != s.dev_hyps[c]:
                    s.unstable += 1
                if rnd == 0:
                    s.partial_ms.append(partial(s, audio))
            for s in runs:
                s.paired_ms.append(times[s.name] - times["default"])
        print(f"  dev round {rnd + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    for i in range(args.repeats):
        lead = np.zeros(round(i * LEAD_STEP_S * SPEECH_RATE), np.float32)
        for q, audio in spoken.items():
            order = runs[k % len(runs):] + runs[:k % len(runs)]
            k += 1
            times = {}
            for s in order:
                text, ms = final(s, np.concatenate([lead, audio]))
                times[s.name] = ms
                s.flite_ms.append(ms)
                s.flite_refs.append(q)
                s.flite_hyps.append(text)
                if right(q, text):
                    s.flite_right[q] = s.flite_right.get(q, 0) + 1
                else:
                    s.flite_wrong.setdefault(q, set()).add(text)
            for s in runs:
                s.flite_paired_ms.append(times[s.name] - times["default"])
    print(f"  flite done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    refs = [ref for _, ref, _ in dev]
    n_words = sum(len(normalize(r)) for r in refs)
    n_flite = len(QUESTIONS) * args.repeats
    print(f"\nWhisper tiny.en settings: {len(dev)} dev clips ({n_words} words), {args.rounds} timed rounds; "
          f"{len(QUESTIONS)} flite questions x {args.repeats} repeats (lead-in +0..{(args.repeats - 1) * LEAD_STEP_S:.2f} s)")
    print("'default' is today's load_recognizer(); sky, flite: questions right; fWER: their WER; times in ms:\n"
          "dev p50/p90 = final decode of the dev clips, d-p50 = median paired difference from default (same\n"
          "clip, same round), flite p50 = final decode of the questions (d-p50 likewise), partial = dev clips\n")
    head = (f"{'setting':<20} {'type':<7} {'beam':>4} {'window':>6} {'devWER':>7} {'sky':>5} {'flite':>6} "
            f"{'fWER':>5} {'dev p50':>7} {'p90':>5} {'d-p50':>6} {'flite p50':>9} {'d-p50':>6} {'partial p50':>11}")
    print(head)
    print("-" * len(head))
    for s in runs:
        w = wer(refs, s.dev_hyps) * 100
        flite_ok = sum(s.flite_right.values())
        print(f"{s.name:<20} {s.compute_type:<7} {s.beam_size:>4} {s.window:>6} {w:>6.1f}% "
              f"{s.flite_right.get(SKY, 0):>2}/{args.repeats:<2} {flite_ok:>2}/{n_flite:<3} "
              f"{wer(s.flite_refs, s.flite_hyps) * 100:>4.1f}% {statistics.median(s.final_ms):>7.0f} {pct(s.final_ms, 90):>5.0f} "
              f"{statistics.median(s.paired_ms):>+6.0f} {statistics.median(s.flite_ms):>9.0f} "
              f"{statistics.median(s.flite_paired_ms):>+6.0f} "
              f"{statistics.median(s.partial_ms):>11.0f}" + (f"  ({s.unstable} unstable)" if s.unstable else ""))
    if args.verbose:
        for s in runs:
            print(f"\n{s.name}:")
            for ref, hyp in zip(refs, s.dev_hyps):
                if wer([ref], [hyp]):
                    print(f"  dev   {ref!r} -> {hyp!r}")
            for q, wrong in s.flite_wrong.items():
                print(f"  flite {q!r} ({args.repeats - s.flite_right.get(q, 0)}x) -> {sorted(wrong)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
