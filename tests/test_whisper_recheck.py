"""An unsure final is asked again on Whisper's full 30 s window, and the surer answer is kept
(`WhisperOptions.unsure_logprob`, `unsure_margin`): the short window that keeps finals quick
mishears some short questions that the full window gets. Partials and sure finals are decoded
once. The real tiny.en model: which window a decode encodes is what is checked, so the
thresholds are set to the ends of the scale where the check must not depend on the CPU."""
import dataclasses

import numpy as np
import pytest

from asr.whisper import WhisperOptions, WhisperRecognizer

pytestmark = pytest.mark.models
FULL = 3000  # Whisper's 30 s window, in feature frames


@pytest.fixture(scope="module")
def whisper():
    return WhisperRecognizer.load()


@pytest.fixture(scope="module")
def question(tmp_path_factory):
    from agent.bench.quality import speak

    return speak("How do I boil an egg?", "kal", tmp_path_factory.mktemp("q") / "q.wav")


def windows(whisper, options: WhisperOptions, audio: np.ndarray, final: bool = True) -> tuple[list[int], str]:
    """The encoder windows one decode used, and its text."""
    rec = WhisperRecognizer(whisper.model, options)
    seen: list[int] = []
    encode = whisper.model.encode

    def spy(features, *a, **k):
        seen.append(features.shape[-1])
        return encode(features, *a, **k)

    whisper.model.encode = spy
    try:
        dec = rec.open_decoder()
        dec.push(audio)
        text = dec.decode().text if final else dec.partial(force=True).text
    finally:
        del whisper.model.encode  # the class's method again
    return seen, text


def test_an_unsure_final_is_decoded_again_on_the_full_window(whisper, question):
    everything_unsure = dataclasses.replace(WhisperOptions(), unsure_logprob=0.0, unsure_margin=0.0)
    seen, _ = windows(whisper, everything_unsure, question)
    assert len(seen) == 2 and seen[0] < FULL and seen[1] == FULL


def test_a_decode_told_not_to_recheck_is_decoded_once_however_unsure(whisper, question):
    """Speech over the bot: the listener waits on its words to cut or resume the reply."""
    everything_unsure = dataclasses.replace(WhisperOptions(), unsure_logprob=0.0, unsure_margin=0.0)
    rec = WhisperRecognizer(whisper.model, everything_unsure)
    seen: list[int] = []
    encode = whisper.model.encode
    whisper.model.encode = lambda features, *a, **k: (seen.append(features.shape[-1]), encode(features, *a, **k))[1]
    try:
        dec = rec.open_decoder()
        dec.push(question)
        dec.decode(quick=True)
    finally:
        del whisper.model.encode
    assert len(seen) == 1 and seen[0] < FULL


def test_a_sure_final_and_a_partial_are_decoded_once_on_the_short_window(whisper, question):
    nothing_unsure = dataclasses.replace(WhisperOptions(), unsure_logprob=-100.0)
    seen, _ = windows(whisper, nothing_unsure, question)
    assert len(seen) == 1 and seen[0] < FULL
    seen, _ = windows(whisper, dataclasses.replace(WhisperOptions(), unsure_logprob=0.0), question, final=False)
    assert len(seen) == 1 and seen[0] < FULL


def test_the_full_windows_answer_is_kept_only_when_surer_by_the_margin(whisper, question):
    never_surer = dataclasses.replace(WhisperOptions(), unsure_logprob=0.0, unsure_margin=1e9)
    off = dataclasses.replace(WhisperOptions(), unsure_logprob=None)
    seen, kept = windows(whisper, never_surer, question)
    assert len(seen) == 2
    assert kept == windows(whisper, off, question)[1]


def test_a_misheard_short_question_is_heard_right_with_the_recheck(whisper, question):
    """flite's kal voice: the short window alone has heard "How do I play with the neck"."""
    from asr.whisper import RECHECK_LOGPROB

    _, text = windows(whisper, WhisperOptions(unsure_logprob=RECHECK_LOGPROB), question)
    assert "egg" in text.lower()


def test_no_speech_is_not_decoded_again(whisper):
    """Quiet noise: the short window finds no words (or Whisper's no-speech rule holds), so the
    full window is not asked even when every final counts as unsure."""
    noise = np.random.default_rng(0).normal(0.0, 0.001, 48000).astype(np.float32)
    everything_unsure = dataclasses.replace(WhisperOptions(), unsure_logprob=0.0, unsure_margin=0.0)
    seen, text = windows(whisper, everything_unsure, noise)
    assert (len(seen), text) == (1, "")


def test_the_full_window_never_takes_the_words_away(whisper, question):
    """A full-window answer with no words is not kept however sure it is: the short window's
    words stay (a user's words over the bot's echo were once lost so, and the reply resumed)."""
    real = whisper.model.model

    class SureOfNothing:
        def __getattr__(self, name):
            return getattr(real, name)

        def generate(self, encoded, prompt, **kw):
            out = real.generate(encoded, prompt, **kw)
            if encoded.shape[1] == FULL // 2:  # the encoder's output of the full window
                eot = whisper._tokenizer()[0].eot
                return [type("Result", (), {"sequences_ids": [[eot]], "scores": [0.0], "no_speech_prob": 0.0})()]
            return out

    everything_unsure = dataclasses.replace(WhisperOptions(), unsure_logprob=0.0, unsure_margin=0.0)
    whisper.model.model = SureOfNothing()
    try:
        seen, text = windows(whisper, everything_unsure, question)
    finally:
        whisper.model.model = real
    assert len(seen) == 2 and text
