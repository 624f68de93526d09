"""Seamless joins between the chunks of one sentence (pure).

The text chunker cuts a sentence into pieces so speech can start early (`tts/chunking.py`). A
voice synthesizes each piece as if it were a whole utterance, with silence before and after it:
Piper (joe-medium) leaves ~50 ms in front and ~140-240 ms behind. Played back to back, a cut in
the middle of a sentence would become a ~0.2 s hole ("The capital of France ... is Paris").
`trim_join` shortens the silence on the sides of a cut: to a short breath after a clause mark,
to almost nothing inside a phrase. Sentence ends keep the voice's own pause.
"""
from __future__ import annotations

import numpy as np

from tts.chunking import ends_clause, ends_sentence

SILENCE = 0.01  # |amplitude| (of full scale) below which a sample counts as silence
KEEP_AFTER_CLAUSE_S = 0.12  # a comma's breath
KEEP_INSIDE_PHRASE_S = 0.03
KEEP_BEFORE_CONTINUATION_S = 0.02


def trim_join(pcm: np.ndarray, sample_rate: int, text: str, continues: bool) -> np.ndarray:
    """Trim the edge silence of one chunk's audio (int16). `continues`: the previous chunk of
    the same answer did not end a sentence, so this one starts in the middle of it."""
    if pcm.size == 0:
        return pcm
    loud = np.flatnonzero(np.abs(pcm.astype(np.float32)) > SILENCE * 32768)
    if loud.size == 0:
        return pcm
    start, end = 0, pcm.size
    if continues:
        start = max(0, int(loud[0]) - int(KEEP_BEFORE_CONTINUATION_S * sample_rate))
    if not ends_sentence(text):
        keep = KEEP_AFTER_CLAUSE_S if ends_clause(text) else KEEP_INSIDE_PHRASE_S
        end = min(pcm.size, int(loud[-1]) + 1 + int(keep * sample_rate))
    return pcm[start:end]
