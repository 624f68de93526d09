"""`duplex bench turns`' core: the labels it puts on the audio and what it measures, on synthetic
VAD frames and stand-in models (milliseconds), then once on flite speech with the real Silero."""
import math

import numpy as np
import pytest

from agent.bench import turns as bt
from agent.conversation.endpointing import CombinedPolicy, RulesPolicy, SmartTurnPolicy
from agent.conversation.turns import TurnConfig
from tests.helpers import flite_available

F = bt.FRAME_S


class Stub:
    """Stand-in models: a fixed smart-turn verdict, a fixed transcript, a fixed text score."""

    def __init__(self, audio_p=0.9, text="hello there.", text_p=0.9):
        self.calls = {"eou": 0, "asr": 0, "text": 0}
        self.audio_p, self.text, self.text_p = audio_p, text, text_p

    def models(self):
        def eou(a):
            self.calls["eou"] += 1
            return self.audio_p

        def asr(a):
            self.calls["asr"] += 1
            return self.text

        def text(t):
            self.calls["text"] += 1
            return self.text_p
        return bt.CachedModels(eou, asr, text)


def _utt(pattern: str, complete: bool, pause=None, end_frame=None) -> bt.Utterance:
    """'#' a speech frame (Silero 0.9), '.' silence; the true end is the end of the last '#'."""
    probs = [0.9 if ch == "#" else 0.05 for ch in pattern]
    last = max(i for i, ch in enumerate(pattern) if ch == "#") + 1
    return bt.Utterance("u", "test", "", complete, np.zeros(len(pattern) * bt.FRAME, dtype=np.float32),
                        (end_frame or last) * F, pause, probs, [0.0] * len(pattern))


def test_latency_is_measured_from_the_true_end_of_speech():
    u = _utt("." * 10 + "#" * 30 + "." * 60, complete=True)
    o = bt.replay(u, bt.Policy("rules", TurnConfig(endpointing=RulesPolicy())), Stub().models(), bt.Costs())
    # a verdict of 0.9 before the pause: the turn ends at the pause, 7 frames (0.224 s) of silence
    assert o.end_s == pytest.approx(47 * F) and o.latency_ms == pytest.approx(7 * F * 1000, abs=0.1)
    assert not o.cut_off


def test_a_turn_ended_inside_the_pause_is_a_false_cut_off():
    pattern = "." * 10 + "#" * 30 + "." * 19 + "#" * 20 + "." * 60  # a 0.61 s pause mid-sentence
    u = _utt(pattern, complete=False, pause=(40 * F, 59 * F))
    stub = Stub(audio_p=0.9)
    o = bt.replay(u, bt.Policy("rules", TurnConfig(endpointing=RulesPolicy())), stub.models(), bt.Costs())
    assert o.cut_off and o.end_s == pytest.approx(47 * F)
    # a verdict of "incomplete" waits past the pause: the turn ends after the second half
    low = bt.replay(u, bt.Policy("rules", TurnConfig(endpointing=RulesPolicy())), Stub(audio_p=0.1, text="so").models(), bt.Costs())
    assert not low.cut_off and low.end_s > 79 * F
    assert low.latency_ms == pytest.approx((low.end_s - 79 * F) * 1000, abs=0.1)
    s = bt.summarize([o, low])
    assert s["incomplete"] == 2 and s["cut_offs"] == 1 and s["cut_off_rate"] == 0.5


def test_verdicts_reach_the_machine_after_their_cost_and_are_asked_once_per_silence():
    u = _utt("." * 10 + "#" * 30 + "." * 60, complete=True)
    costs = bt.Costs(eou_s=0.025, asr_s=0.1, text_s=0.04)
    pol = bt.Policy("rules", TurnConfig(endpointing=RulesPolicy()))
    stub = Stub(audio_p=0.9, text="hello there")
    o = bt.replay(u, pol, stub.models(), costs)
    # "rules": SpeechStopped at the first silent frame (41 F); smart-turn at +25 ms, then the decode at +125 ms
    (t_a, kind_a, _), (t_t, kind_t, _) = o.features[0], o.features[1]
    assert (kind_a, kind_t) == ("audio_p", "text")
    assert t_a == pytest.approx(41 * F + 0.025, abs=1e-3) and t_t == pytest.approx(41 * F + 0.125, abs=1e-3)
    assert stub.calls == {"eou": 1, "asr": 1, "text": 0}


def test_combined_asks_smart_turn_after_the_text_only_when_it_could_change_the_wait():
    u = _utt("." * 10 + "#" * 30 + "." * 60, complete=True)
    costs = bt.Costs(eou_s=0.025, asr_s=0.1, text_s=0.04)
    pol = bt.Policy("combined", TurnConfig(endpointing=CombinedPolicy(min_wait_s=0.1)))
    # a text score that decides alone: the decode first (+100 ms), the text at +140 ms ends the turn
    decided = Stub(audio_p=0.1, text="hello there", text_p=0.999)
    o = bt.replay(u, pol, decided.models(), costs)
    assert [k for _, k, _ in o.features] == ["text_p"]
    assert o.features[0][0] == pytest.approx(41 * F + 0.14, abs=1e-3)
    assert o.end_s == pytest.approx(o.features[0][0], abs=1e-3)
    assert decided.calls == {"eou": 0, "asr": 1, "text": 1}
    # one on the fence (its logit cancels the bias): smart-turn is asked then, and its
    # "complete" ends the turn 25 ms later
    fence = Stub(audio_p=0.9, text="hello there", text_p=1 / (1 + math.exp(CombinedPolicy().text_bias)))
    o = bt.replay(u, pol, fence.models(), costs)
    assert [k for _, k, _ in o.features] == ["text_p", "audio_p"]
    assert o.features[1][0] == pytest.approx(41 * F + 0.165, abs=1e-3)
    assert o.end_s == pytest.approx(o.features[1][0], abs=1e-3)
    assert fence.calls == {"eou": 1, "asr": 1, "text": 1}


def test_a_silences_early_decode_waits_for_the_one_before_as_in_the_listener():
    # a second short silence while the first one's decode runs (300 ms): its early decode, and
    # the smart-turn check before it, wait for that decode; by then the user speaks again, so
    # neither is asked (ListenMachine.on_early_turn). The third silence's are.
    u = _utt("." * 10 + "#" * 30 + "..." + "#" * 4 + "..." + "#" * 4 + "." * 60, complete=True)
    stub = Stub(audio_p=0.9, text="so I was")
    pol = bt.Policy("smart-turn", TurnConfig(endpointing=SmartTurnPolicy()))
    o = bt.replay(u, pol, stub.models(), bt.Costs(eou_s=0.025, asr_s=0.3))
    assert [k for _, k, _ in o.features] == ["audio_p", "text", "audio_p"]
    assert stub.calls == {"eou": 2, "asr": 2, "text": 0}
    assert o.features[2][0] == pytest.approx(55 * F + 0.025, abs=1e-3)
    assert o.end_s == pytest.approx(61 * F)  # "complete": at the pause, 7 frames after the speech


def test_the_text_model_is_asked_once_per_silence_and_text():
    # the transcript is judged before the pause and again at it: one check, the pause waits for it
    u = _utt("." * 10 + "#" * 30 + "." * 60, complete=True)
    pol = bt.Policy("combined", TurnConfig(endpointing=CombinedPolicy()))
    o = bt.replay(u, pol, Stub(audio_p=0.1, text="so I was", text_p=1e-9).models(), bt.Costs())
    assert [k for _, k, _ in o.features].count("text_p") == 1
    assert o.features[0][0] == pytest.approx(41 * F + 0.14, abs=1e-3)


def test_the_joined_halves_are_labelled_where_the_pause_is():
    rate = bt.RATE
    t = np.arange(int(0.8 * rate)) / rate
    first = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    rest = first[: int(0.5 * rate)]
    u = bt.make_incomplete("x", "test", "a ... b", first, rest, 0.6)
    start, end = u.pause
    assert start == pytest.approx(bt.LEAD_S + 0.8, abs=0.02)
    assert end - start == pytest.approx(0.6, abs=0.01)
    assert u.speech_end_s == pytest.approx(end + 0.5, abs=0.02)
    c = bt.make_complete("y", "test", "a", first)
    assert c.speech_end_s == pytest.approx(bt.LEAD_S + 0.8, abs=0.02) and c.pause is None


@pytest.mark.skipif(not flite_available(), reason="flite is not installed")
def test_flite_speech_through_silero_detects_the_cut_off(tmp_path):
    from asr.vad import SileroVAD

    utts = bt.build_corpus(tmp_path, None, ("slt",), sentences=[("What should I cook for", "dinner tonight?")])
    assert [u.complete for u in utts] == [True, False]  # no recogniser: no cut copy
    bt.score_vad(utts, SileroVAD().new_stream)
    _, inc = utts
    assert inc.pause[0] < inc.pause[1] < inc.speech_end_s and inc.pause[1] - inc.pause[0] > 0.29
    pol = bt.Policy("rules", TurnConfig(endpointing=RulesPolicy()))
    outs = bt.run_policy(utts, pol, Stub(audio_p=0.9).models(), bt.Costs())
    assert not outs[0].cut_off and 150 < outs[0].latency_ms < 400
    assert outs[1].cut_off  # "complete" at the first pause: ended inside it
