"""Seamless joins between the chunks of one sentence (pure).

The text chunker cuts a sentence into pieces so speech can start early (`tts/chunking.py`). A
voice synthesizes each piece as if it were a whole utterance, with silence before and after it:
Piper (joe-medium) leaves ~50 ms in front and ~140-240 ms behind. Played back to back, a cut in
the middle of a sentence would become a ~0.2 s hole ("The capital of France ... is Paris").
`trim_join` shortens the silence on the sides of a cut: to a short breath after a clause mark,
to almost nothing inside a phrase. Sentence ends keep the voice's own pause. A sentence's start
keeps only `KEEP_BEFORE_SENTENCE_S` of the voice's lead-in (Piper: ~35-50 ms): the answer's first
sound is then heard that much sooner, and between sentences the previous one's pause remains.

Inside a chunk no pause lasts longer than `MAX_PAUSE_S` (`shorten_pauses`): Piper's comma pauses
run 0.23-0.48 s, longer than its own sentence ends (0.14-0.24 s) and three times the breath a
comma keeps where the chunker cut (0.14 s), so the same reply's commas would differ with where it
was cut; a listener hears the long ones as the bot stopping.
"""
from __future__ import annotations

import numpy as np

from tts.chunking import ends_clause, ends_sentence

SILENCE = 0.01  # |amplitude| (of full scale) below which a sample counts as silence
KEEP_AFTER_CLAUSE_S = 0.12  # a comma's breath
KEEP_INSIDE_PHRASE_S = 0.03
KEEP_BEFORE_CONTINUATION_S = 0.02
KEEP_BEFORE_SENTENCE_S = 0.01
MAX_PAUSE_S = 0.25  # the longest silence inside a chunk's sound


def trim_join(pcm: np.ndarray, sample_rate: int, text: str, continues: bool) -> np.ndarray:
    """Trim the edge silence of one chunk's audio (int16). `continues`: the previous chunk of
    the same answer did not end a sentence, so this one starts in the middle of it."""
    if pcm.size == 0:
        return pcm
    loud = _sounding(pcm)
    if loud.size == 0:
        return pcm
    lead = KEEP_BEFORE_CONTINUATION_S if continues else KEEP_BEFORE_SENTENCE_S
    start, end = max(0, int(loud[0]) - int(lead * sample_rate)), pcm.size
    if not ends_sentence(text):
        keep = KEEP_AFTER_CLAUSE_S if ends_clause(text) else KEEP_INSIDE_PHRASE_S
        end = min(pcm.size, int(loud[-1]) + 1 + int(keep * sample_rate))
    # every sound is inside the trimmed span: its indices, shifted, are the span's
    return _shortened(pcm[start:end], loud - start, int(MAX_PAUSE_S * sample_rate))


def shorten_pauses(pcm: np.ndarray, sample_rate: int, most_s: float = MAX_PAUSE_S) -> np.ndarray:
    """Each silence between two sounds of `pcm` (int16) that is longer than `most_s` loses its
    middle: its first and last halves of `most_s` stay (a soft consonant that starts the next
    word, a breath's fade). The silence before the first and after the last sound is kept."""
    return _shortened(pcm, _sounding(pcm), int(most_s * sample_rate))


def _sounding(pcm: np.ndarray) -> np.ndarray:
    """The indices of the samples of `pcm` (int16) that are not silence."""
    return np.flatnonzero(np.abs(pcm.astype(np.float32)) > SILENCE * 32768)


def _shortened(pcm: np.ndarray, loud: np.ndarray, most: int) -> np.ndarray:
    """`shorten_pauses`, given the sounding samples `loud` and the longest silence in samples."""
    long_gaps = np.flatnonzero(np.diff(loud) - 1 > most)
    if long_gaps.size == 0:
        return pcm
    pieces, at = [], 0
    for g in long_gaps:
        quiet_from, quiet_to = int(loud[g]) + 1, int(loud[g + 1])  # the silence [from, to)
        pieces.append(pcm[at:quiet_from + most // 2])
        at = quiet_to - (most - most // 2)
    pieces.append(pcm[at:])
    return np.concatenate(pieces)
