"""A partial decode gives way when the user stops: `keep_going` abandons it after the encoder,
so the decode of the utterance's end never waits for a whole partial."""
import pytest
import soundfile as sf
from helpers import DEV

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def recognizer():
    from asr import load_recognizer

    return load_recognizer().whisper


def _clip():
    name = (DEV / "transcripts.tsv").read_text().splitlines()[0].split("\t")[0]
    audio, rate = sf.read(DEV / name, dtype="float32")
    assert rate == 16000
    return audio


@pytest.mark.skipif(not (DEV / "transcripts.tsv").exists(), reason="shared/speech/dev is missing")
def test_a_partial_stops_after_the_encoder_when_told_and_the_next_one_decodes(recognizer):
    audio = _clip()
    stream = recognizer.open_decoder()
    stream.push(audio)
    calls = []
    generated = []
    real = recognizer.model.model

    class Spy:  # CTranslate2's model object is read-only: stand a recording proxy in front of it
        def __getattr__(self, name):
            return getattr(real, name)

        def generate(self, *args, **kwargs):
            generated.append(1)
            return real.generate(*args, **kwargs)

    recognizer.model.model = Spy()
    try:
        # asked before the decode (yes) and after the encoder (no): no text is generated
        assert stream.partial(keep_going=lambda: calls.append(1) or len(calls) < 2) is None
        assert len(calls) == 2 and not generated
        # nothing was consumed: the same audio decodes on the next call, without waiting a hop
        hyp = stream.partial(keep_going=lambda: True)
        assert hyp is not None and hyp.text and generated
        assert stream.partial(keep_going=lambda: True) is None  # now a hop of new audio is needed
    finally:
        recognizer.model.model = real
    assert stream.decode().text  # the utterance is intact
