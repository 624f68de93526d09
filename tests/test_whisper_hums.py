"""The embedded Whisper on hums over a phone line: flite's "Mm-hmm." through 8 kHz μ-law and the
server's streaming resampler is written as a hum (a backchannel, no interruption), where an
unprimed decode writes words ("And then make a man."); words keep their words."""
import numpy as np
import pytest
from helpers import say, silence

from agent.conversation.turns import interrupting_words
from transport.audio import StreamResampler, resample
from transport.telephony.g711 import ulaw_decode, ulaw_encode

pytestmark = pytest.mark.models
RATE = 16000
LEADS = (0.0, 0.1, 0.2, 0.3)  # where the utterance's audio may start before the speech (s)


@pytest.fixture(scope="module")
def whisper():
    from asr.whisper import WhisperRecognizer

    return WhisperRecognizer.load()


def over_the_phone(x: np.ndarray) -> np.ndarray:
    """What the server decodes of a caller's 16 kHz audio: 8 kHz μ-law, back to 16 kHz in 20 ms chunks."""
    pcm = (np.clip(resample(x, RATE, 8000), -1, 1) * 32767).astype(np.int16)
    line = ulaw_decode(ulaw_encode(pcm)).astype(np.float32) / 32768
    up = StreamResampler(8000, RATE)
    return np.concatenate([up(line[i:i + 160]) for i in range(0, line.size, 160)])


def heard(whisper, audio: np.ndarray) -> list[str]:
    out = []
    for lead in LEADS:
        dec = whisper.open_decoder()
        dec.push(over_the_phone(np.concatenate([silence(lead), audio])))
        out.append(dec.decode().text)
    return out


def test_a_hum_over_the_phone_is_written_as_a_hum(whisper, tmp_path, monkeypatch):
    import asr.whisper

    hum = say("Mm-hmm.", tmp_path / "mm.wav")
    texts = heard(whisper, hum)
    assert all(interrupting_words(t) == 0 for t in texts), texts
    monkeypatch.setattr(asr.whisper, "HUM_RETRY_LOGPROB", float("-inf"))  # no second, primed decode
    unprimed = heard(whisper, hum)
    assert any(interrupting_words(t) > 0 for t in unprimed), f"the hum needs no priming now: {unprimed}"


@pytest.mark.parametrize("words", ["No.", "Okay.", "Stop, stop. Wait a moment please.", "How many legs does a spider have?"])
def test_words_over_the_phone_keep_their_words(whisper, tmp_path, monkeypatch, words):
    import asr.whisper

    audio = say(words, tmp_path / "w.wav")
    texts = heard(whisper, audio)
    assert all(interrupting_words(t) > 0 for t in texts), texts
    monkeypatch.setattr(asr.whisper, "HUM_RETRY_LOGPROB", float("-inf"))
    assert heard(whisper, audio) == texts  # the primed decode, if asked, changed nothing


def test_a_hum_is_told_however_whisper_spells_it_and_in_a_look_cut_by_its_token_limit():
    from asr.whisper import written_as_hum

    for hum in ("Mm-hmm.", "M-H-M.", "Mm-m-hmm.", "Uh-huh."):
        assert written_as_hum(hum) and written_as_hum(hum, cut_short=True), hum
    for words in ("And then, make sure.", "Hmm, no.", "Mm-hmm, stop.", "Um, what?", ""):
        assert not written_as_hum(words) and not written_as_hum(words, cut_short=True), words
    # a look's decode may end mid-hum at its token limit; a final's may not (dev "five five")
    assert written_as_hum("Mm-hmm. Mm-", cut_short=True) and not written_as_hum("Mm-hmm. Mm-")


def test_a_look_at_a_long_hum_hears_a_hum_where_its_token_limit_cuts_the_primed_answer(whisper, tmp_path, monkeypatch):
    # rms's "Mm-hmm." runs 1.4 s; a look (`UtteranceDecoder.glance`: greedy, a short window, at
    # most `glance_max_tokens`) at its first 1.2 s hears words unprimed ("and the HMM") and,
    # primed, "Mm-hmm. Mm-": a hum cut where the token limit ends it, which once counted as words
    import asr.whisper

    hum = say("Mm-hmm.", tmp_path / "mm.wav", voice="rms")
    hum = hum * (10 ** (-24 / 20) / float(np.sqrt(np.mean(hum ** 2))))  # a user's level
    noise = np.random.default_rng(0).normal(0, 10 ** (-60 / 20), RATE * 2).astype(np.float32)
    audio = np.concatenate([silence(0.3), hum])
    audio = audio + noise[:audio.size]

    def look() -> str:
        dec = whisper.open_decoder()
        dec.push(audio)
        return dec.glance(int(1.5 * RATE))  # 0.3 s of lead, 1.2 s of the hum

    primed = look()
    assert interrupting_words(primed) == 0, primed
    monkeypatch.setattr(asr.whisper, "HUM_RETRY_LOGPROB", float("-inf"))
    unprimed = look()
    assert interrupting_words(unprimed) > 0, f"the hum needs no priming now: {unprimed}"
