"""asr.whisper's thread count: timed once a process on a CPU, unless the caller names one."""
import pytest
import soundfile as sf

import asr.whisper as whisper
from asr.whisper import WhisperRecognizer
from helpers import DEV, dev_reference


def test_the_faster_count_wins_and_its_model_is_the_one_kept(monkeypatch):
    monkeypatch.setattr(whisper.os, "cpu_count", lambda: 8)
    made = []
    timings = {1: [0.30, 0.12, 0.31], 4: [0.20, 0.18, 0.19]}  # one thread's best round is the fastest

    def make(threads):
        made.append(threads)
        return threads

    monkeypatch.setattr(whisper, "_probe_decode", lambda model: timings[model].pop(0))
    assert whisper._fastest_threads(make) == (1, 1)
    assert sorted(made) == [1, 4] and timings == {1: [], 4: []}  # both timed, interleaved, 3 rounds each


def test_one_core_times_nothing(monkeypatch):
    monkeypatch.setattr(whisper.os, "cpu_count", lambda: 1)
    monkeypatch.setattr(whisper, "_probe_decode", lambda model: pytest.fail("nothing to choose between"))
    assert whisper._fastest_threads(lambda n: f"model/{n}") == (1, "model/1")


@pytest.mark.models
def test_load_times_the_real_model_once_and_a_named_count_is_used_as_given(monkeypatch):
    import faster_whisper

    monkeypatch.setattr(whisper, "_TUNED_THREADS", {})
    probes, made = [], []
    real_probe, real_model = whisper._probe_decode, faster_whisper.WhisperModel
    monkeypatch.setattr(whisper, "_probe_decode", lambda model: probes.append(model) or real_probe(model))
    monkeypatch.setattr(faster_whisper, "WhisperModel",
                        lambda *a, cpu_threads, **kw: made.append(cpu_threads) or real_model(*a, cpu_threads=cpu_threads, **kw))
    first = WhisperRecognizer.load()
    (threads,) = whisper._TUNED_THREADS.values()
    many = min(4, whisper.os.cpu_count() or 1)
    assert threads in {1, many}
    assert len(probes) == (0 if many == 1 else 6)  # 3 rounds of two counts, or one core and nothing to time
    assert sorted(made) == sorted({1, many})  # the winner's model is kept, not made again
    again = WhisperRecognizer.load()
    assert len(probes) in {0, 6} and made[-1] == threads  # not timed again
    WhisperRecognizer.load(cpu_threads=3)
    assert made[-1] == 3 and len(probes) in {0, 6}
    clip = "sense_and_sensibility_01_austen_64kb-0880.wav"
    audio, _ = sf.read(DEV / clip, dtype="float32")
    for recognizer in (first, again):  # working models
        heard = recognizer.transcribe(audio)[0].lower().strip(".").split()
        said = dev_reference(clip).split()
        assert heard[:4] == said[:4] and heard[-2:] == said[-2:], heard  # greedy tiny.en: "an old-spose young man"
