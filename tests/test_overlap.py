"""The overlap styles (agent/conversation/overlap.py), each driving the turn machine the way its
doc says, on the same speech over the bot (Driver style, no models)."""
import pytest
from test_turns import B, I, T, Driver

from agent.conversation.overlap import BALANCED, DEFAULT_STYLE, FLOOR_HOLDING, RESPONSIVE, STYLES
from agent.conversation.addressing import addressed_elsewhere, may_call_someone
from agent.conversation.turns import CancelReply, DiscardTranscript, PauseReply, ResumeReply, TurnConfig


def speaking(style) -> Driver:
    """A user turn at level 0.3, answered; the bot speaks."""
    d = Driver()
    d.m.config = style.apply(d.m.config)
    d.frames("#" * 20 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "tell me a story")
    d.m.on_reply_started(d.t)
    assert d.m.state == B
    return d


def test_the_default_style_is_the_turn_machines_default():
    assert STYLES[DEFAULT_STYLE] is BALANCED
    assert BALANCED.apply(TurnConfig()) == TurnConfig()


def test_responsive_stops_for_a_quiet_voice_and_a_yeah_starts_a_new_reply():
    d = speaking(RESPONSIVE)
    n = len(d.log)
    d.frames("#" * 10 + "." * 8, level=0.03).eou(0.9)  # a TV 20 dB below the user
    assert d.kinds()[n] == PauseReply and d.m.state == T, "no resume before the words"
    d.log += d.m.on_final(d.t, "Yeah.")
    assert d.kinds()[-1] == CancelReply


def test_balanced_talks_through_a_quiet_voice_and_goes_on_as_a_brief_yeah_ends():
    d = speaking(BALANCED)
    n = len(d.log)
    d.frames("#" * 10 + "." * 8, level=0.03)
    assert d.kinds()[n:] == [] and d.m.state == B
    d.frames("#" * 10 + "." * 15, level=0.3)  # its words slower than the wait
    assert d.kinds()[n] == PauseReply and d.kinds()[-1] == ResumeReply and d.m.state == B
    assert d.m.on_final(d.t, "Yeah.")[-1:] != [CancelReply(d.t)] and d.m.state == B


def test_floor_holding_does_not_even_pause_for_half_a_second_but_yields_to_more():
    d = speaking(FLOOR_HOLDING)
    n = len(d.log)
    d.frames("#" * 14 + "." * 8, level=0.3)  # 0.45 s: a "yeah"
    assert PauseReply not in d.kinds()[n:] and d.m.state == B
    d.frames("#" * 16, level=0.3)  # a real interruption, 0.5 s in
    assert d.kinds()[-2] == PauseReply and d.m.state == I


@pytest.mark.parametrize("style", list(STYLES.values()), ids=list(STYLES))
def test_every_style_is_cut_by_a_real_interruption(style):
    d = speaking(style)
    d.frames("#" * 60 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Wait, what is the capital of France?")
    assert d.kinds()[-1] == CancelReply


def test_side_talk_is_told_by_who_the_words_call():
    for said in ("Honey, can you grab my keys from the table?", "Tom, please feed the dog.", "Hey Jenny, the phone.",
                 "Kids, it's time to brush your teeth."):
        assert addressed_elsewhere(said), said
        assert may_call_someone(said), said  # a partial of it waits for these words (on_words)
    for said in ("Wait, what is the capital of France?", "Sorry, what animal says moo?", "Hold on, stop.",
                 "Okay, stop.", "Hey, what time is it?", "Can you close the window?", "Stop."):
        assert not addressed_elsewhere(said), said
    assert not addressed_elsewhere("Ava, stop.", own_names=("ava",))


def test_a_misheard_stop_is_no_name_and_a_stop_is_for_the_bot_whoever_it_calls():
    # Whisper's takes of "Stop, stop. Wait a moment please." over the bot's echo in a browser
    for said in ("Tots, top way to momentally", "Chuck, wait a moment, please.", "Tuck, tuck, tuck,",
                 "Tats, tat, wait a moment.", "Honey, stop the music.", "Tom, hold on a second."):
        assert not addressed_elsewhere(said), said


def test_side_talk_over_the_bot_lets_it_go_on_and_is_no_turn_but_its_own_name_cuts_it():
    d = speaking(BALANCED)
    d.frames("#" * 60 + "." * 8, level=0.3).eou(0.9)
    out = d.m.on_final(d.t, "Honey, can you grab my keys from the table?")
    assert [type(c) for c in out] == [DiscardTranscript, ResumeReply] and d.m.state == B
    d = speaking(BALANCED)
    d.m.config.own_names = ("ava",)
    d.frames("#" * 60 + "." * 8, level=0.3).eou(0.9)
    assert d.m.on_final(d.t, "Ava, stop.") == [CancelReply(d.t)]
    d = speaking(RESPONSIVE)  # the style that stops for anything answers it
    d.frames("#" * 60 + "." * 8, level=0.3).eou(0.9)
    assert d.m.on_final(d.t, "Honey, can you grab my keys from the table?") == [CancelReply(d.t)]


def test_a_partial_that_opens_by_calling_someone_waits_for_the_punctuated_words():
    # Whisper's partials come without the comma: "Babe did you lock" cut the reply before the
    # final, "Babe, did you lock the back door?", could tell it was side talk
    assert may_call_someone("Babe did you lock") and may_call_someone("hey Tom please feed")
    assert not may_call_someone("Tom hold on a") and not may_call_someone("what is the")
    assert not may_call_someone("Ava did you", own_names=("ava",))
    d = speaking(BALANCED)
    d.frames("#" * 20, level=0.3)
    assert d.m.on_words(d.t, "Babe did you lock") == []  # no cut on the partial
    d.frames("#" * 20 + "." * 8, level=0.3).eou(0.9)
    out = d.m.on_final(d.t, "Babe, did you lock the back door?")
    assert [type(c) for c in out] == [DiscardTranscript, ResumeReply] and d.m.state == B
    d = speaking(BALANCED)  # words for the bot still cut on the partial
    d.frames("#" * 20, level=0.3)
    assert d.m.on_words(d.t, "what is the capital") == [CancelReply(d.t)]
    d = speaking(RESPONSIVE)  # the style that stops for anything cuts on the partial
    d.frames("#" * 20, level=0.3)
    assert d.m.on_words(d.t, "Babe did you lock") == [CancelReply(d.t)]
