"""The default recognizer, streamed in 20 ms pushes, over the real recordings in shared/speech/dev."""
import pytest
import soundfile as sf

from asr.wer import cer, normalize, wer
from helpers import DEV

pytestmark = pytest.mark.models


def test_normalizer():
    assert normalize("Mr. Smith, 29340 - ten!") == ["mister", "smith", "2", "9", "3", "4", "0", "10"]
    assert wer(["a b c"], ["a x c"]) == pytest.approx(1 / 3)


def test_cer_counts_letters_not_word_boundaries():
    ref = "The capital of France is Paris."
    assert cer([ref], ["the capital of Francis Paris"]) == pytest.approx(1 / 25)  # one "e"
    assert cer([ref], ["The capital of France is"]) == pytest.approx(5 / 25)  # "paris" lost
    assert cer([ref, "ab"], [ref, "ax"]) == pytest.approx(1 / 27)


@pytest.mark.skipif(not (DEV / "transcripts.tsv").exists(), reason="shared/speech/dev is missing")
def test_default_recognizer_wer_on_dev_set():
    from asr import load_recognizer

    rec = load_recognizer()
    refs, hyps = [], []
    for line in (DEV / "transcripts.tsv").read_text().splitlines():
        name, ref = line.split("\t")
        audio, rate = sf.read(DEV / name, dtype="float32")
        assert rate == rec.sample_rate
        stream = rec.open_decoder()
        partials = []
        for i in range(0, audio.size, 320):
            stream.push(audio[i:i + 320])
            if (p := stream.partial()) is not None:
                partials.append(p)
        final = stream.finalize()
        assert final.final and final.words, name
        assert all(a.start <= b.start for a, b in zip(final.words, final.words[1:]))
        assert final.words[-1].end <= audio.size / rate + 0.5
        if audio.size / rate > 2.5:
            assert partials, f"{name}: no partial during {audio.size / rate:.1f} s of audio"
        refs.append(ref)
        hyps.append(final.text)
    score = wer(refs, hyps)
    print(f"WER {score:.3f} over {len(refs)} clips")
    for r, h in zip(refs, hyps):
        print(f"  {r!r} -> {h!r}")
    assert score <= 0.12
