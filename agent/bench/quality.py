"""`duplex bench quality`: is the user heard right, and answered rather than echoed, and how fast.

Two parts, on the same audio:

1. The recognizer, offline: the final decode of every clip in `../shared/speech/dev` (dev WER,
   `asr.wer`) and of a set of spoken statements and questions (`SPOKEN`, each with a key word,
   each spoken by flite's four voices and by Piper): the share whose key word is heard. For
   duplex's default decode, its alternatives (`--alternatives`) and, as the reference,
   faster-whisper's own defaults on the same weights (`model.transcribe`, beam 5, 30 s window,
   temperature fallback) with its VAD off (as pipecat runs it, behind its own VAD) and on.
   Decodes are interleaved clip by clip, the settings' order rotated, because the CPU is shared.
2. The conversation: the spoken set replayed at real-time pace through a `Session`
   (`agent.bench.latency.run_mode`, the WAV transport, default models), once per setting in
   `--session` (each sentence once, the voices in turn): the key words heard in the live
   finals, the share of replies that echo the user, and voice-to-voice p50/p90 of that run.

A reply echoes the user when at least half of its content words (lower-cased, stop words
dropped, a plural or -ing/-ed ending cut) are words of the user's turn as heard. "He was not a
young man." after "He was not an old-sposed young man." echoes (2 of 2); "The sky is blue
because air scatters blue light more." after "Why is the sky blue?" does not (2 of 6). A short
answer that restates a question ("The capital of France is Paris.") counts as an echo too, so
the set asks questions whose answers need new words. The bench also counts, as `(most)`, the
replies of which more than half of the content words are the user's (the issue's wording, "most
of the reply's words"): a restated question with its answer is none of those. And it counts, as
`stock`, the replies that say four words in a row of an earlier reply ("Have a nice day." closing
one reply after another): a prompt can trade echoes for such a formula, which no echo count sees.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.bench.latency import (ASR_RATE, LEAD_S, ScriptLine, _dev_clip, _dev_transcripts, default_dev_dir,
                                 run_mode, speech_end_offset, warm_up)
from asr.wer import normalize, wer

# (what is said, its key word, statement or question). Statements are where a small model
# echoes; the questions' answers need words the question does not have.
SPOKEN = [
    ("I just got back from a long walk in the park.", "park", "statement"),
    ("Why is the sky blue?", "sky", "question"),
    ("My sister is moving to Canada next month.", "Canada", "statement"),
    ("How far away is the moon?", "moon", "question"),
    ("The train was late again this morning.", "train", "statement"),
    ("What do bees make?", "bees", "question"),
    ("I think I left the oven on.", "oven", "statement"),
    ("How do I boil an egg?", "egg", "question"),
    ("We are planning a trip to the mountains.", "mountains", "statement"),
    ("Who wrote Romeo and Juliet?", "Romeo", "question"),
    ("My phone battery keeps dying.", "battery", "statement"),
    ("How many days are in a leap year?", "leap", "question"),
    ("Turn left at the next corner.", "corner", "statement"),
    ("What is a good name for a puppy?", "puppy", "question"),
    ("The coffee here is too bitter.", "coffee", "statement"),
    ("Can you recommend a book about history?", "history", "question"),
    ("I can't decide what to wear tonight.", "wear", "statement"),
    ("What time zone is London in?", "London", "question"),
    ("It is raining again.", "raining", "statement"),
    ("Why do cats purr?", "purr", "question"),
]
VOICES = ["slt", "kal", "awb", "rms", "piper"]  # flite's four, then Piper's default voice

STOP_WORDS = set("""a an the and or but if so of to in on at by for with from as is are was were be been
being am do does did have has had i you he she it we they me him her us them my your his its our
their this that these those there here what which who whom whose when where why how not no yes
can could will would shall should may might must just very too also than then about into over
again some any all more most such only own same other up down out off s t don't can't i'm it's
that's you're i've let's""".split())


def content_words(text: str) -> list[str]:
    """The words that carry meaning: normalised, stop words dropped, crude stems."""
    out = []
    for w in normalize(text):
        if w in STOP_WORDS:
            continue
        for suffix in ("ing", "ed", "es", "s"):
            if w.endswith(suffix) and len(w) - len(suffix) >= 3:
                w = w[: -len(suffix)]
                break
        out.append(w)
    return out


def echo_share(user: str, reply: str) -> float:
    """The share of `reply`'s content words that are words of the user's turn (0 for no words)."""
    said, words = set(content_words(user)), content_words(reply)
    return sum(w in said for w in words) / len(words) if words else 0.0


def echoes(user: str, reply: str) -> bool:
    """Whether `reply` says the user's own words back: at least half of its content words."""
    return echo_share(user, reply) >= 0.5


def mostly_echoes(user: str, reply: str) -> bool:
    """The issue's wording, "most of the reply's words in the user's turn": more than half. A
    restated question with its answer ("Romeo and Juliet were written by Shakespeare.") is not."""
    return echo_share(user, reply) > 0.5


def stock_phrase(reply: str, earlier: list[str], n: int = 4) -> bool:
    """Whether `reply` says a run of `n` words that an earlier reply said ("Have a nice day."
    closing reply after reply): a small model's formula, which the echo count does not see."""
    def runs(text: str) -> set[tuple[str, ...]]:
        w = normalize(text)
        return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    said = set().union(*(runs(e) for e in earlier)) if earlier else set()
    return bool(runs(reply) & said)


def key_heard(key: str, heard: str) -> bool:
    return all(k in normalize(heard) for k in normalize(key))


# ---- audio -----------------------------------------------------------------------------------
def speak(text: str, voice: str, path: Path, piper=None) -> np.ndarray:
    """`text` spoken by flite's `voice` or by Piper (`voice == "piper"`), float32 at 16 kHz."""
    if voice == "piper":
        from transport.audio import resample

        pcm = piper.synthesize(text).astype(np.float32) / 32768.0
        return resample(pcm, piper.sample_rate, ASR_RATE).astype(np.float32)
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(path)], check=True, capture_output=True)
    return _dev_clip(path)


def flite_speech_span(text: str, voice: str) -> tuple[float, float]:
    """(end of the opening silence, start of the closing one), seconds, by flite's own segment
    times for `text` in `voice` (`flite -psdur`): where `speak`'s speech begins and ends."""
    out = subprocess.run(["flite", "-voice", voice, "-psdur", "-t", text, "-o", "/dev/null"],
                         capture_output=True, text=True, check=True).stdout.split()
    segments = [(s.split(":")[0], float(s.split(":")[1])) for s in out if ":" in s]
    onset = segments[0][1] if segments[0][0] == "pau" else 0.0
    end = segments[-2][1] if segments[-1][0] == "pau" else segments[-1][1]
    return onset, end


@dataclass
class Clip:
    name: str
    text: str
    key: str | None  # None for a dev clip
    kind: str  # "dev", "statement" or "question"
    pcm: np.ndarray  # 16 kHz, no lead


def spoken_clips(work: Path, piper) -> list[Clip]:
    """Every sentence of `SPOKEN` in every voice."""
    return [Clip(f"s{i}:{voice}", text, key, kind, speak(text, voice, work / f"s{i}-{voice}.wav", piper))
            for i, (text, key, kind) in enumerate(SPOKEN) for voice in VOICES]


def in_turn(clips: list[Clip]) -> list[Clip]:
    """Each sentence once, the voices in turn: the conversation's script."""
    wanted = {f"s{i}:{VOICES[i % len(VOICES)]}" for i in range(len(SPOKEN))}
    return [c for c in clips if c.name in wanted]


def dev_clips(dev_dir: Path) -> list[Clip]:
    return [Clip(name, ref, None, "dev", _dev_clip(dev_dir / name)) for name, ref in _dev_transcripts(dev_dir).items()]


# ---- recognizer settings ---------------------------------------------------------------------
@dataclass
class Setting:
    name: str
    decode: object  # Callable[[np.ndarray], str]
    hyps: dict[str, str] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)


def whisper_options(**changes):
    """WhisperOptions() with `changes`; None when this version has no such option."""
    from asr.whisper import WhisperOptions

    names = {f.name for f in dataclasses.fields(WhisperOptions)}
    if not set(changes) <= names:
        return None
    return dataclasses.replace(WhisperOptions(), **changes)


ALTERNATIVES = {  # name -> WhisperOptions changes from the default
    "greedy": {"final_beam_size": 1},
    "beam5": {"final_beam_size": 5},
    "beam3": {"final_beam_size": 3},
    "pad20": {"final_window_pad_s": 20.0},  # more dev words right, every turn slower
    "no-recheck": {"unsure_logprob": None},  # `--asr-recheck never`
    "full-window": {"final_window_pad_s": 30.0},  # every final on the 30 s window
}


def duplex_decode(recognizer):
    def decode(audio: np.ndarray) -> str:
        dec = recognizer.open_decoder()
        dec.push(audio)
        return dec.decode().text
    return decode


def faster_whisper_decode(model, vad: bool):
    """faster-whisper's `transcribe` with its defaults, as pipecat's WhisperSTTService calls it."""
    def decode(audio: np.ndarray) -> str:
        segments, _ = model.transcribe(audio, language="en", beam_size=5, vad_filter=vad)
        return " ".join(s.text.strip() for s in segments).strip()
    return decode


def recognizer_settings(whisper, alternatives: list[str], reference: bool) -> list[Setting]:
    from asr.whisper import WhisperRecognizer

    out = [Setting("default", duplex_decode(WhisperRecognizer(whisper.model, whisper.options, name="default")))]
    for name in alternatives:
        opts = whisper_options(**ALTERNATIVES[name])
        if opts is None or opts == whisper.options:
            print(f"  ({name}: not an option of this version, or the default itself: skipped)", file=sys.stderr)
            continue
        out.append(Setting(name, duplex_decode(WhisperRecognizer(whisper.model, opts, name=name))))
    if reference:
        out.append(Setting("faster-whisper", faster_whisper_decode(whisper.model, vad=False)))
        out.append(Setting("faster-whisper+vad", faster_whisper_decode(whisper.model, vad=True)))
    return out


def run_recognizers(settings: list[Setting], clips: list[Clip]) -> None:
    for s in settings:  # warm-up: first calls allocate
        s.decode(clips[0].pcm)
    for k, clip in enumerate(clips):
        for s in settings[k % len(settings):] + settings[:k % len(settings)]:
            t = time.perf_counter()
            s.hyps[clip.name] = s.decode(clip.pcm)
            s.ms[clip.name] = (time.perf_counter() - t) * 1000


def recognizer_figures(s: Setting, dev: list[Clip], spoken: list[Clip]) -> dict:
    heard = [c.name for c in spoken if key_heard(c.key, s.hyps[c.name])]
    dev_ms = [s.ms[c.name] for c in dev]
    return {
        "dev_wer": round(wer([c.text for c in dev], [s.hyps[c.name] for c in dev]) * 100, 2),
        "keywords_heard": len(heard), "keywords_of": len(spoken),
        "spoken_wer": round(wer([c.text for c in spoken], [s.hyps[c.name] for c in spoken]) * 100, 2),
        "final_ms_p50": round(float(np.percentile(dev_ms, 50)), 1),
        "final_ms_p90": round(float(np.percentile(dev_ms, 90)), 1),
        "spoken_final_ms_p50": round(float(np.median([s.ms[c.name] for c in spoken])), 1),
        "hyps": dict(s.hyps),
    }


# ---- conversations ---------------------------------------------------------------------------
def script_of(clips: list[Clip]) -> list[ScriptLine]:
    lead = np.zeros(int(LEAD_S * ASR_RATE), dtype=np.float32)
    lines = []
    for c in clips:
        pcm = np.concatenate([lead, c.pcm])
        lines.append(ScriptLine(c.name, c.text, pcm, speech_end_offset(pcm, ASR_RATE)))
    return lines


def conversation_figures(res: dict, clips: list[Clip]) -> dict:
    rows = res["turns"]
    replies = [(r.get("heard", ""), r.get("reply", "")) for r in rows if r.get("reply")]
    echoed = [r["input"] for r in rows if r.get("reply") and echoes(r.get("heard", ""), r["reply"])]
    heard = sum(key_heard(c.key, r.get("heard", "")) for c, r in zip(clips, rows))
    return {"keywords_heard": heard, "keywords_of": len(clips), "replies": len(replies),
            "echoes": len(echoed), "echo_share": round(len(echoed) / len(replies), 3) if replies else None,
            "echoed": echoed,
            "mostly_echoes": sum(bool(r.get("reply")) and mostly_echoes(r.get("heard", ""), r["reply"]) for r in rows),
            "voice_to_voice_p50_ms": res["voice_to_voice_p50_ms"], "voice_to_voice_p90_ms": res["voice_to_voice_p90_ms"],
            "stages_mean_ms": res["stages_mean_ms"], "loop_lag": res["loop_lag"],
            "repeated_replies": sum(r.get("reply") in [x.get("reply") for x in rows[:i]]
                                    for i, r in enumerate(rows) if r.get("reply")),
            "stock_phrases": sum(stock_phrase(r["reply"], [x.get("reply") or "" for x in rows[:i]])
                                 for i, r in enumerate(rows) if r.get("reply")),
            "turns": [{k: r.get(k) for k in ("input", "said", "heard", "reply", "voice_to_voice_ms")} for r in rows]}


# ---- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from llm import bundled

    p = argparse.ArgumentParser(prog="duplex bench quality", description=__doc__.split("\n")[0])
    p.add_argument("--dev-dir", type=Path, default=None, help="directory of the dev clips (default ../shared/speech/dev)")
    p.add_argument("--alternatives", default="greedy,no-recheck",
                   help=f"comma-separated recognizer settings measured beside the default: {', '.join(ALTERNATIVES)}")
    p.add_argument("--no-reference", action="store_true", help="skip faster-whisper's own defaults")
    p.add_argument("--session", default="default",
                   help="comma-separated settings replayed as conversations (default, or alternatives); '' for none")
    p.add_argument("--rounds", type=int, default=1, help="conversation runs of each --session setting, interleaved")
    p.add_argument("--llm", default=bundled.DEFAULT, help=f"{bundled.names_help()} | path.gguf")
    p.add_argument("--tts", default="piper")
    p.add_argument("--system-prompt", default=None, help="instead of the default agent's instructions")
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--gap", type=float, default=1.0, help="silence after a reply before the next input (s)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every hypothesis and reply")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="write all figures to this JSON file")
    args = p.parse_args(argv)
    args.alternatives = [a.strip() for a in args.alternatives.split(",") if a.strip()]
    args.session = [a.strip() for a in args.session.split(",") if a.strip()]
    unknown = [a for a in args.alternatives + args.session if a != "default" and a not in ALTERNATIVES]
    if unknown:
        p.error(f"unknown settings {unknown}: use {', '.join(ALTERNATIVES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from agent.conversation.endpointing import DEFAULT_POLICY
    from agent.conversation.models import ModelChoice, load_models
    from asr.whisper_stream import StreamingWhisper

    models = load_models(ModelChoice(llm=args.llm, tts=args.tts))
    whisper = models.asr.whisper
    report: dict = {"config": {"llm": args.llm, "tts": models.tts.name, "cpus": os.cpu_count(),
                               "default_options": dataclasses.asdict(whisper.options)}}
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        piper = models.tts if models.tts.name.startswith("piper") else None
        if piper is None:
            from tts.piper_voice import PiperSynthesizer
            piper = PiperSynthesizer()
        spoken = spoken_clips(Path(tmp), piper)
    dev = dev_clips(args.dev_dir or default_dev_dir())
    if not dev:
        raise SystemExit("no dev clips (transcripts.tsv) found: use --dev-dir")

    t0 = time.perf_counter()
    settings = recognizer_settings(whisper, args.alternatives, not args.no_reference)
    run_recognizers(settings, dev + spoken)
    recog = {s.name: recognizer_figures(s, dev, spoken) for s in settings}
    print(f"duplex bench quality: {len(dev)} dev clips, {len(spoken)} spoken statements and questions "
          f"(voices {', '.join(VOICES)}); {os.cpu_count()} CPUs, shared: times are noisy")
    print(f"\nrecognizer, final decodes ({time.perf_counter() - t0:.0f} s): dev WER; key words heard; "
          "final decode ms on the dev clips (p50/p90) and the spoken set (p50)")
    print(f"{'setting':<20} {'dev WER':>7} {'keywords':>8} {'spWER':>6} {'dev p50':>7} {'p90':>5} {'spoken p50':>10}")
    for name, f in recog.items():
        print(f"{name:<20} {f['dev_wer']:>6.1f}% {f['keywords_heard']:>4}/{f['keywords_of']:<3} {f['spoken_wer']:>5.1f}% "
              f"{f['final_ms_p50']:>7.0f} {f['final_ms_p90']:>5.0f} {f['spoken_final_ms_p50']:>10.0f}")
    if args.verbose:
        for s in settings:
            for c in dev + spoken:
                if wer([c.text], [s.hyps[c.name]]):
                    print(f"  {s.name}: {c.text!r} -> {s.hyps[c.name]!r}")
    report["recognizer"] = recog

    conv: dict = {}
    if args.session:
        asyncio.run(warm_up(models))
        script = script_of(in_turn(spoken))
        run_args = argparse.Namespace(gap=args.gap, reply_timeout=30.0, max_tokens=args.max_tokens,
                                      first_chunk_words=2, endpointing=DEFAULT_POLICY,
                                      system_prompt=args.system_prompt, work_dir=None)
        with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
            for rnd in range(args.rounds):
                for name in args.session:
                    opts = whisper.options if name == "default" else whisper_options(**ALTERNATIVES[name])
                    if opts is None:
                        continue
                    from asr.whisper import WhisperRecognizer

                    asr = StreamingWhisper(WhisperRecognizer(whisper.model, opts, name=name))
                    try:
                        res = asyncio.run(run_mode(dataclasses.replace(models, asr=asr), script, "concurrent",
                                                   run_args, Path(tmp) / f"bot-{name}-{rnd}.wav"))
                    finally:
                        asr.close()
                    conv.setdefault(name, []).append(conversation_figures(res, in_turn(spoken)))
        print("\nconversations (concurrent mode): key words heard in the live finals; replies that echo "
              "the user (at least half of their content words the user's; more than half: most); replies word for "
              "word an earlier one's, or four words in a row of one (stock); voice-to-voice (first bot audio - exact end "
              "of speech)")
        print(f"{'setting':<20} {'round':>5} {'keywords':>8} {'echoes':>8} {'(most)':>6} {'repeats':>7} {'stock':>5} "
              f"{'v2v p50':>8} {'p90':>6}")
        for name, runs in conv.items():
            for rnd, f in enumerate(runs):
                print(f"{name:<20} {rnd + 1:>5} {f['keywords_heard']:>4}/{f['keywords_of']:<3} "
                      f"{f['echoes']:>3}/{f['replies']:<4} {f['mostly_echoes']:>6} {f['repeated_replies']:>7} {f['stock_phrases']:>5} "
                      f"{f['voice_to_voice_p50_ms'] or 0:>8.0f} "
                      f"{f['voice_to_voice_p90_ms'] or 0:>6.0f}")
                if args.verbose:
                    for t in f["turns"]:
                        mark = "ECHO " if t["input"] in f["echoed"] else "     "
                        print(f"    {mark}{t['heard']!r} -> {t['reply']!r}")
    report["conversations"] = conv
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2))
        print(f"figures written to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
