"""A sentence cut into chunks for early speech plays without holes at the cuts; sentence ends keep
the voice's own pause, and no pause inside a chunk is longer than `MAX_PAUSE_S`. Pure checks on
synthetic audio, then the real Piper voice."""
import numpy as np
import pytest

from tts.joins import (KEEP_AFTER_CLAUSE_S, KEEP_BEFORE_CONTINUATION_S, KEEP_BEFORE_SENTENCE_S, KEEP_INSIDE_PHRASE_S,
                       MAX_PAUSE_S, shorten_pauses, trim_join)

SR = 1000  # 1 sample per ms keeps the arithmetic readable


def tone(lead_ms: int, body_ms: int, tail_ms: int) -> np.ndarray:
    x = np.zeros(lead_ms + body_ms + tail_ms, np.int16)
    x[lead_ms:lead_ms + body_ms] = 8000
    return x


def edges(x: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(x) > 300)
    return int(loud[0]), int(x.size - 1 - loud[-1])


def test_cut_inside_a_phrase_keeps_almost_no_silence():
    out = trim_join(tone(50, 400, 200), SR, "The capital of France", continues=False)
    # the answer's first chunk: its sound starts almost at once, and the cut leaves no hole
    assert edges(out) == (int(KEEP_BEFORE_SENTENCE_S * SR), int(KEEP_INSIDE_PHRASE_S * SR))


def test_after_a_clause_mark_a_breath_remains():
    out = trim_join(tone(50, 400, 200), SR, "Well, rain falls,", continues=False)
    assert edges(out)[1] == int(KEEP_AFTER_CLAUSE_S * SR)


def test_continuation_loses_its_lead_and_a_sentence_end_keeps_its_tail():
    out = trim_join(tone(50, 400, 200), SR, "is Paris.", continues=True)
    assert edges(out) == (int(KEEP_BEFORE_CONTINUATION_S * SR), 200)
    out = trim_join(tone(50, 400, 200), SR, "It is lovely!", continues=False)
    assert edges(out) == (int(KEEP_BEFORE_SENTENCE_S * SR), 200)


def test_silence_and_empty_audio_pass_through():
    assert trim_join(np.zeros(300, np.int16), SR, "uh", continues=True).size == 300
    assert trim_join(np.zeros(0, np.int16), SR, "uh", continues=True).size == 0


@pytest.mark.models
async def test_piper_cut_sentence_has_no_hole_at_the_cut():
    from tts.piper_voice import PiperSynthesizer

    voice = PiperSynthesizer()

    async def texts():
        for t in ("The capital of France", "is Paris.", "It is lovely."):
            yield t

    chunks = [c async for c in voice.stream(texts())]
    sr = voice.sample_rate
    quiet = 0.01 * 32768

    def lead_tail_ms(x):
        loud = np.flatnonzero(np.abs(x.astype(np.float32)) > quiet)
        return loud[0] / sr * 1000, (x.size - 1 - loud[-1]) / sr * 1000

    (lead0, tail0), (lead1, tail1), (lead2, _) = (lead_tail_ms(c.pcm) for c in chunks)
    assert lead0 <= KEEP_BEFORE_SENTENCE_S * 1000 + 1, lead0  # the answer is heard at once
    assert tail0 + lead1 <= 60, (tail0, lead1)  # the cut inside the sentence: no audible hole
    assert tail1 + lead2 >= 120, (tail1, lead2)  # between sentences: the voice's own pause stays
    assert [c.text for c in chunks] == ["The capital of France", "is Paris.", "It is lovely."]


def test_a_long_pause_inside_a_chunk_is_shortened_and_a_short_one_kept():
    x = np.concatenate([tone(50, 300, 0), np.zeros(480, np.int16), tone(0, 300, 0), np.zeros(120, np.int16),
                        tone(0, 200, 200)])
    out = trim_join(x, SR, "He tried to escape, but he could not.", continues=False)
    loud = np.abs(out) > 300
    gaps = np.diff(np.flatnonzero(loud)) - 1
    assert sorted(int(g) for g in gaps if g > 0) == [120, int(MAX_PAUSE_S * SR)]  # 480 -> 250, 120 kept
    assert edges(out) == (int(KEEP_BEFORE_SENTENCE_S * SR), 200)  # the sentence end's own pause stays
    assert out.size == x.size - 50 + int(KEEP_BEFORE_SENTENCE_S * SR) - (480 - int(MAX_PAUSE_S * SR))
    assert shorten_pauses(np.zeros(600, np.int16), SR).size == 600


@pytest.mark.models
async def test_piper_comma_pause_is_no_longer_than_the_longest_pause():
    from tts.piper_voice import PiperSynthesizer

    voice = PiperSynthesizer()
    text = "He had been trying to find a way to escape, but he had been unable to do so."
    raw = voice.synthesize(text)
    (chunk,) = [c async for c in voice.stream(_one(text))]
    sr, quiet = voice.sample_rate, 0.01 * 32768

    def longest_pause_ms(x):
        loud = np.flatnonzero(np.abs(x.astype(np.float32)) > quiet)
        return (np.diff(loud) - 1).max() / sr * 1000

    assert longest_pause_ms(raw) > MAX_PAUSE_S * 1000 + 50  # the voice's own (~475 ms)
    assert longest_pause_ms(chunk.pcm) <= MAX_PAUSE_S * 1000 + 1


async def _one(text):
    yield text
