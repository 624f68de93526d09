"""Where does `duplex bench overlap` put the user's speech? Its rule (`agent.bench.overlap.speech_span`)
against flite's own segment times (`flite -psdur`: where the opening silence ends and the closing
one begins) over the bench's phrases in flite's four voices. Prints how far each rule's onsets and
ends fall from flite's, and which voices hold the onsets off by more than 50 ms.

    .venv/bin/python scripts/bench_onsets.py [--min-run-s 0.02 0.005]
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.bench import overlap as ov  # noqa: E402
from agent.bench.quality import flite_speech_span, speak  # noqa: E402

FLITE_VOICES = ("slt", "kal", "awb", "rms")


def phrases() -> list[str]:
    said = {half for pair in ov.PAUSED for half in pair}
    said |= set(ov.QUESTIONS) | set(ov.STORIES) | {q for q, _ in ov.INTERRUPTIONS}
    said |= set(ov.BACKCHANNELS) | set(ov.BACKGROUND) | set(ov.SIDE_TALK)
    return sorted(said)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-run-s", type=float, nargs="+", default=[0.02, 0.005],
                   help="speech_span's shortest run (0.005: any lone 5 ms step)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp())
    off: dict[float, dict[str, list[float]]] = {r: {"onset": [], "end": []} for r in args.min_run_s}
    late_voices: dict[float, collections.Counter] = {r: collections.Counter() for r in args.min_run_s}
    for voice in FLITE_VOICES:
        for text in phrases():
            pcm = speak(text, voice, work / "x.wav")
            onset, end = flite_speech_span(text, voice)
            for r in args.min_run_s:
                a, b = ov.speech_span(pcm, min_run_s=r)
                off[r]["onset"].append(a - onset)
                off[r]["end"].append(b - end)
                late_voices[r][voice] += abs(a - onset) > 0.05
    n = len(FLITE_VOICES) * len(phrases())
    for r in args.min_run_s:
        for what, errs in off[r].items():
            e = np.asarray(errs)
            print(f"min run {r * 1000:.0f} ms, {what}s: median {np.median(e) * 1000:+.0f} ms, p10/p90"
                  f" {np.percentile(e, 10) * 1000:+.0f}/{np.percentile(e, 90) * 1000:+.0f} ms,"
                  f" off by more than 50 ms {int(np.sum(np.abs(e) > 0.05))} of {n}")
        print(f"  onsets off by more than 50 ms, by voice: {dict(late_voices[r])}")


if __name__ == "__main__":
    main()
