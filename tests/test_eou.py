"""agent.conversation.eou.SmartTurn: the same probability as pipecat's own analyzer, and sensible verdicts."""
import asyncio
import time

import numpy as np
import pytest

from helpers import DEV, flite_available, say, silence

pytestmark = [pytest.mark.models,
              pytest.mark.skipif(not flite_available(), reason="flite is not installed")]

COMPLETE = "What is the capital of France?"
CUT = "What is the capital of"


def as_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


@pytest.fixture(scope="module")
def model():
    from agent.conversation.eou import SmartTurn

    return SmartTurn()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Utterances as pipecat sees them: int16 PCM (0.5 s lead-in, 0.2 s of trailing silence)."""
    d = tmp_path_factory.mktemp("eou")
    pad = lambda x: as_int16(np.concatenate([silence(0.5), x, silence(0.2)]))  # noqa: E731
    complete = pad(say(COMPLETE, d / "complete.wav"))
    cut = pad(say(CUT, d / "cut.wav"))
    import soundfile as sf

    dev, rate = sf.read(DEV / "sense_and_sensibility_01_austen_64kb-0870.wav", dtype="float32")
    assert rate == 16000
    long = np.concatenate([complete, as_int16(dev), complete])  # > 8 s: only the last 8 s count
    assert long.size > 8 * 16000
    return {"complete": complete, "cut": cut, "long": long}


def pipecat_probability(pcm16: np.ndarray) -> float:
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    ref = LocalSmartTurnAnalyzerV3()
    ref.set_sample_rate(16000)  # without it pipecat silently scores 0
    ref.append_audio(pcm16.tobytes(), is_speech=True)
    _, metrics = asyncio.run(ref.analyze_end_of_turn())
    assert metrics is not None, "pipecat produced no prediction"
    return metrics.probability


@pytest.mark.parametrize("name", ["complete", "cut", "long"])
def test_probability_equals_pipecat_analyzer(model, clips, name):
    pcm16 = clips[name]
    ours = model.probability(pcm16.astype(np.float32) / 32768.0)  # pipecat's int16 -> float
    ref = pipecat_probability(pcm16)
    print(f"{name}: ours {ours:.6f} pipecat {ref:.6f}")
    assert 0.0 <= ours <= 1.0
    assert ours == pytest.approx(ref, abs=1e-4)


def test_complete_sentence_scores_high_and_cut_lower(model, clips):
    to_f = lambda pcm16: pcm16.astype(np.float32) / 32768.0  # noqa: E731
    p_complete = model.probability(to_f(clips["complete"]))
    p_cut = model.probability(to_f(clips["cut"]))
    n = 5
    t = time.perf_counter()
    for _ in range(n):
        model.probability(to_f(clips["complete"]))
    ms = (time.perf_counter() - t) / n * 1000
    t = time.perf_counter()
    for _ in range(n):
        model.features(to_f(clips["complete"]))
    feat_ms = (time.perf_counter() - t) / n * 1000
    print(f"complete {p_complete:.3f}  cut {p_cut:.3f}  |  {ms:.1f} ms per call "
          f"({feat_ms:.1f} ms features), shared 2-core CPU")
    assert p_complete > 0.5
    assert p_cut < p_complete


def test_as_of_pause_appends_only_the_silence_not_heard_yet():
    from agent.conversation.eou import as_of_pause

    x = np.ones(1600, dtype=np.float32)
    out = as_of_pause(x, heard_silence_s=0.05, pause_s=0.2)
    assert out.size == 1600 + 2400 and np.array_equal(out[:1600], x) and not out[1600:].any()
    assert as_of_pause(x, heard_silence_s=0.2, pause_s=0.2) is x
    assert as_of_pause(x, heard_silence_s=0.5, pause_s=0.2) is x


def test_a_question_asked_about_at_the_first_silent_frame_is_complete(model, tmp_path):
    """The session asks smart-turn ~30 ms into the silence, about the audio as of the pause.
    Asked about the bare 30 ms, the model calls this complete question incomplete."""
    from agent.conversation.eou import as_of_pause

    x = say(COMPLETE, tmp_path / "q.wav")
    x = x[:np.nonzero(np.abs(x) > 0.01)[0][-1] + 1]  # ends where the voice does
    early = np.concatenate([silence(0.5), x, silence(0.03)])
    bare, as_paused = model.probability(early), model.probability(as_of_pause(early, 0.03, 0.2))
    print(f"30 ms of silence: {bare:.3f}; as of the 0.2 s pause: {as_paused:.3f}")
    assert as_paused > 0.5


def test_the_text_turn_model_read_ahead_on_a_partial_gives_the_same_verdict():
    """`TextTurnScorer.warm` on the words so far leaves the check at the pause to read only the
    words after them; its verdict is the one it gives from scratch."""
    from agent.conversation.eou import TextTurnScorer

    scorer = TextTurnScorer.load()
    llm, read = scorer._llm, []
    real_eval = llm.eval
    llm.eval = lambda tokens: (read.append(len(tokens)), real_eval(tokens))[1]
    final, partial = "How many legs does a spider have?", "How many legs does this spider"

    def check_after(before: str, warm: bool) -> tuple[float, int]:
        scorer.probability(before)  # something else in its cache
        if warm:
            scorer.warm(partial)
        read.clear()
        return scorer.probability(final), read[0]

    cold, cold_tokens = check_after("Tell me a story about a dragon.", warm=False)
    warm, warm_tokens = check_after("Tell me a story about a dragon.", warm=True)
    assert warm == pytest.approx(cold, rel=1e-3)
    assert warm_tokens <= 4 < cold_tokens, (warm_tokens, cold_tokens)  # " a spider have" after the partial


def test_a_stopped_text_read_ahead_leaves_the_verdict_as_from_scratch():
    """The listener stops the text turn model's read-ahead when the user stops speaking: the
    decode aborts at once, and the check at the pause gives the verdict it gives from scratch."""
    from agent.conversation.eou import TextTurnScorer
    from llm.base import ReadAheadStop

    scorer = TextTurnScorer.load()
    llm, stop, aborted = scorer._llm, ReadAheadStop(), []
    real_eval = llm.eval
    final = "How many legs does a spider have?"
    cold = scorer.probability(final)
    scorer.probability("Tell me a story about a dragon.")  # something else in its cache

    def eval_then_stop(tokens):
        stop.set()  # while llama.cpp decodes these tokens
        try:
            return real_eval(tokens)
        except RuntimeError:
            aborted.append(len(tokens))
            raise

    llm.eval = eval_then_stop
    try:
        scorer.warm("How many legs does this spider", stop)
    finally:
        del llm.eval
    assert aborted
    assert scorer.probability(final) == pytest.approx(cold, rel=1e-3)
