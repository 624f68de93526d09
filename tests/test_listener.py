"""The listener alone, on test doubles: audio in as fast as it comes, turn events out."""
from __future__ import annotations

import numpy as np

from agent.conversation import listener as L
from agent.tracing.trace import NullTracer
from agent.conversation.endpointing import CombinedPolicy, SilencePolicy
from agent.conversation.turns import TurnConfig
from doubles import EnergyVAD, ScriptedRecognizer, burst
from transport.base import AudioIn

RATE = 16000


async def listen(script: list[str], audio: np.ndarray, eou=None, listener_config: dict | None = None,
                 out: list | None = None, **turns) -> tuple[list, L.Listener, ScriptedRecognizer]:
    turns.setdefault("endpointing", CombinedPolicy() if eou is not None else SilencePolicy())
    cfg = TurnConfig(**turns)
    out = [] if out is None else out

    async def emit(ev):
        out.append(ev)

    asr = ScriptedRecognizer(script)
    listener = L.Listener(asr, EnergyVAD(), eou, L.ListenerConfig(cfg, **(listener_config or {})), NullTracer(), emit)
    await listener.open()
    for k in range(0, audio.size, 320):
        await listener.on_audio(AudioIn(audio[k:k + 320], RATE))
        if any(isinstance(e, L.TurnEnded) for e in out):
            await L.asyncio.sleep(0)  # let the final's task run between frames, as in real time
    for t in [listener._final_task, listener._early_task]:
        if t is not None:
            await t
    return out, listener, asr


def gap(s: float) -> np.ndarray:
    return np.zeros(int(s * RATE), np.float32)


async def test_a_turn_takes_the_words_that_end_before_its_end_of_speech():
    audio = np.concatenate([gap(0.3), burst(0.8), gap(1.0)])
    out, listener, asr = await listen(["what is the capital of France"], audio)
    kinds = [type(e) for e in out]
    assert kinds.index(L.UserStarted) < kinds.index(L.TurnEnded) < kinds.index(L.UserTranscript)
    (final,) = [e for e in out if isinstance(e, L.UserTranscript)]
    (ended,) = [e for e in out if isinstance(e, L.TurnEnded)]
    assert final.text == "what is the capital of France"
    assert all(w.start < ended.t_speech_end + 0.2 for w in final.words)
    assert 1.0 < ended.t_speech_end < 1.2
    # the recognizer was fed every sample, silence included
    assert abs(asr.open_streams[0].fed_s - audio.size / RATE) < 0.02
    await listener.close()
    assert asr.open_streams == []


async def test_the_pause_gives_a_transcript_to_speculate_on_before_the_turn_ends():
    audio = np.concatenate([gap(0.3), burst(0.6), gap(1.0)])
    out, listener, _ = await listen(["how many legs"], audio)
    kinds = [type(e) for e in out]
    assert L.PauseTranscript in kinds and kinds.index(L.PauseTranscript) < kinds.index(L.TurnEnded)
    assert [e.text for e in out if isinstance(e, L.PauseTranscript)] == ["how many legs"]
    await listener.close()


class TurnScores:
    """An end-of-turn double with a text score: fixed scores, and what the listener had said
    before each text check (`seen`)."""

    def __init__(self, out: list, text_p: float, audio_p: float = 0.5):
        self.out, self.text_p, self.audio_p, self.seen = out, text_p, audio_p, []

    def probability(self, audio) -> float:
        return self.audio_p

    def text_probability(self, text: str) -> float:
        self.seen.append([type(e) for e in self.out])
        return self.text_p


async def test_the_reply_speculates_while_the_text_model_judges_the_pause():
    """With cores for both, the pause's transcript is offered before the text check, so the
    reply's prompt runs beside it; a verdict that ends the turn then commits that speculation."""
    out: list = []
    eou = TurnScores(out, text_p=0.9)
    audio = np.concatenate([gap(0.3), burst(0.6), gap(1.0)])
    _, listener, _ = await listen(["what is the capital of France"], audio, eou=eou, out=out, endpointing=CombinedPolicy())
    assert eou.seen and all(L.PauseTranscript in seen for seen in eou.seen), eou.seen
    kinds = [type(e) for e in out]
    assert kinds.index(L.PauseTranscript) < kinds.index(L.TurnEnded) < kinds.index(L.UserTranscript)
    await listener.close()


async def test_on_one_core_the_text_model_judges_before_the_reply_speculates():
    """`speculate_before_verdict=False`: the verdict first (a turn it ends has its final next,
    the same decode: nothing to speculate on); the transcript is offered only after it."""
    out: list = []
    eou = TurnScores(out, text_p=1e-9)
    audio = np.concatenate([gap(0.3), burst(0.6), gap(2.0)])  # unfinished: the turn waits the 1.5 s cap
    _, listener, _ = await listen(["what is the capital of France"], audio, eou=eou, out=out, endpointing=CombinedPolicy(),
                                  listener_config={"speculate_before_verdict": False})
    assert eou.seen and all(L.PauseTranscript not in seen for seen in eou.seen), eou.seen
    kinds = [type(e) for e in out]
    assert kinds.index(L.PauseTranscript) < kinds.index(L.TurnEnded) < kinds.index(L.UserTranscript)
    await listener.close()


async def test_speech_after_a_pause_voids_it_and_the_turn_holds_both_parts():
    audio = np.concatenate([gap(0.3), burst(0.6), gap(0.35), burst(0.5, seed=1), gap(1.0)])
    out, listener, _ = await listen(["I'd like to book", "a table"], audio)
    kinds = [type(e) for e in out]
    assert kinds.index(L.PauseTranscript) < kinds.index(L.UserResumed) < kinds.index(L.TurnEnded)
    assert [e.text for e in out if isinstance(e, L.UserTranscript)] == ["I'd like to book a table"]
    await listener.close()


async def test_two_turns_each_get_their_own_words():
    audio = np.concatenate([gap(0.3), burst(0.6), gap(1.0), burst(0.6, seed=4), gap(1.0)])
    out, listener, _ = await listen(["first question", "second one"], audio)
    assert [e.text for e in out if isinstance(e, L.UserTranscript)] == ["first question", "second one"]
    await listener.close()


async def test_noise_without_words_ends_a_turn_with_an_empty_transcript():
    audio = np.concatenate([gap(0.3), burst(0.6), gap(1.0)])
    out, listener, _ = await listen([""], audio)
    assert [e.text for e in out if isinstance(e, L.UserTranscript)] == [""]
    await listener.close()


async def test_a_word_that_began_before_the_end_of_speech_belongs_to_the_turn():
    """A server may put a word's end past the end of speech (post-roll): it stays in this turn,
    not carried into the next one (where the next utterance's start would drop it)."""
    from doubles import ScriptedStream
    from asr.base import Word

    class LateEnds(ScriptedStream):
        def _end_segment(self):
            super()._end_segment()
            if self._pending:
                last = self._pending[-1]
                self._pending[-1] = Word(last.text, last.start, last.end + 0.4)

        async def _emit_due(self, t):
            if self._segment is None and self._pending:
                t = max(t, self._pending[-1].end)  # the server sends the word at the utterance's end
            await super()._emit_due(t)

    audio = np.concatenate([gap(0.3), burst(0.8), gap(1.0), burst(0.6, seed=5), gap(1.0)])
    cfg = TurnConfig(endpointing=SilencePolicy())
    out: list = []

    async def emit(ev):
        out.append(ev)

    asr = ScriptedRecognizer(["tell me a story about a cat", "thanks"])
    asr.open_stream = lambda: _open(asr)

    async def _open(rec):
        stream = LateEnds(rec)
        rec.open_streams.append(stream)
        return stream

    listener = L.Listener(asr, EnergyVAD(), None, L.ListenerConfig(cfg), NullTracer(), emit)
    await listener.open()
    for k in range(0, audio.size, 320):
        await listener.on_audio(AudioIn(audio[k:k + 320], RATE))
        await L.asyncio.sleep(0)
    await listener._final_task
    assert [e.text for e in out if isinstance(e, L.UserTranscript)] == ["tell me a story about a cat", "thanks"]
    await listener.close()
