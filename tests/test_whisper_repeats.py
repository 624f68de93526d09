"""asr.whisper.drop_repeated_tail: Whisper's "says it again" hallucination, on token lists."""
from asr.whisper import drop_repeated_tail

STORY = [100, 101, 102, 103, 104, 105, 106, 13]  # " Tell me a short story about a cat."


def test_an_utterance_said_twice_is_kept_once():
    assert drop_repeated_tail([*STORY, *STORY]) == STORY
    assert drop_repeated_tail([*STORY, *STORY, *STORY]) == STORY


def test_a_repeated_clause_at_the_end_goes_and_the_words_before_it_stay():
    lead = [7, 8, 9]
    clause = [20, 21, 22, 23, 24]
    assert drop_repeated_tail([*lead, *clause, *clause]) == [*lead, *clause]


def test_short_repeats_and_repeats_that_are_not_at_the_end_stay():
    no_no = [50, 11, 50, 13]  # "No, no."
    assert drop_repeated_tail(no_no) == no_no
    twice_short = [60, 61, 62, 60, 61, 62]  # 3 tokens said twice: a person may well do that
    assert drop_repeated_tail(twice_short) == twice_short
    middle = [*STORY, *STORY, 1, 2, 3]
    assert drop_repeated_tail(middle) == middle
    assert drop_repeated_tail([]) == []
