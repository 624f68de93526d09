"""How intelligible are chunked replies? Round-trip WER of the default voice by first-chunk size.

Each sentence is cut by `tts.chunking.TextChunker` as a streaming reply would be (first chunk of
N words, the rest at clauses), synthesized chunk by chunk by the default voice with the session's
joins (`tts.joins.trim_join`), and transcribed by the embedded recognizer (Whisper tiny.en). The
sizes run interleaved, `--runs` times (Piper's output varies from run to run), so a slow or odd
spell does not land on one size. `--first-words 0` means no chunking (whole sentences).

    .venv/bin/python scripts/chunk_join_wer.py [--runs 5] [--first-words 0 4 2]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr.base import SPEECH_RATE  # noqa: E402
from asr.wer import edit_distance, normalize  # noqa: E402
from asr.whisper import WhisperRecognizer  # noqa: E402
from tts.chunking import TextChunker  # noqa: E402
from tts.piper_voice import PiperSynthesizer  # noqa: E402

# Short answers of the kind a voice assistant gives (no numbers that the normaliser would spell
# differently on the two sides).
SENTENCES = [
    "The capital of France is Paris.", "A spider has eight legs.",
    "Rain forms when water vapor cools into droplets.", "For dinner tonight, you should cook a hearty stew.",
    "The sky is blue because air scatters blue light.", "Go to bed at the same time every night.",
    "Once upon a time, a small cat lived in a quiet village.", "Eight of spades, four of clubs, seven of hearts.",
    "I would suggest a warm cup of tea before bed.", "The sun rises in the east and sets in the west.",
    "Paris is the capital and the largest city of France.", "Spiders have eight legs and most of them spin webs.",
    "Honey never spoils if you keep it sealed.", "Try reading a book instead of looking at your phone.",
    "Water boils when it gets very hot.", "Here is a simple recipe for pancakes.",
    "He was a small man with a big hat.", "Have a glass of warm milk before you sleep.",
    "Hold the button for five seconds to reset it.", "Sure, I can help you with that.",
    "Happy birthday to your sister.", "Whales are mammals, not fish.", "Saturn has beautiful rings made of ice.",
    "Take a short walk after dinner.", "How about a salad with grilled chicken?",
    "The train leaves at half past seven.", "Fish need clean water to stay healthy.",
    "Keep your room cool, dark and quiet.", "She found a hidden key under the mat.", "His favorite color is green.",
]


def pieces(text: str, first_words: int) -> list[str]:
    """The chunks a streaming reply of `text` is spoken in (one token per word, as the LLM's)."""
    if first_words <= 0:
        return [text]
    chunker = TextChunker(first_max_words=first_words)
    out: list[str] = []
    for token in text.replace(" ", " \0").split("\0"):
        out += chunker.push(token)
    return out + chunker.flush()


async def speak(voice: PiperSynthesizer, chunks: list[str]) -> np.ndarray:
    async def texts():
        for c in chunks:
            yield c

    audio = [c.pcm async for c in voice.stream(texts())]
    return np.concatenate(audio).astype(np.float32) / 32768.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--first-words", type=int, nargs="+", default=[0, 4, 2])
    args = p.parse_args(argv)
    voice = PiperSynthesizer()
    asr = WhisperRecognizer.load("whisper-tiny.en")
    errors = {n: [] for n in args.first_words}
    words = sum(len(normalize(s)) for s in SENTENCES)
    for run in range(args.runs):
        for n in args.first_words:
            e = 0
            for s in SENTENCES:
                pcm = asyncio.run(speak(voice, pieces(s, n)))
                text, _ = asr.transcribe(soxr.resample(pcm, voice.sample_rate, SPEECH_RATE))
                e += edit_distance(normalize(s), normalize(text))
            errors[n].append(e)
            print(f"run {run + 1}: first chunk {n or 'whole'}: {e} errors in {words} words", flush=True)
    print(f"{len(SENTENCES)} sentences x {args.runs} runs, Whisper tiny.en round trip of {voice.name}")
    for n, es in errors.items():
        print(f"  first chunk {str(n) + ' words' if n else 'none (whole sentences)':<26} "
              f"WER {sum(es) / (words * len(es)):.3f}  (errors per run: {es})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
