"""Detokenisation with the ASR delay, following moshi-server's word timing."""

from asr.engine.kyutai import WordAssembler, WordEnd, WordStart


def test_words_and_times_with_delay():
    words = WordAssembler(delay_frames=2, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    # position p -> token; step_idx = p + 1; tokens before step_idx 2 are ignored.
    stream = [5, 3, 0, 1, 2, 3, 3, 0, 4, 0]
    events = [(p, ev) for p, tok in enumerate(stream) for ev in words.push(tok, p)]
    assert events == [
        (5, WordStart("ab", 0.08)),  # token 0 at p=2 set the stop time (3-2)/12.5; 'ab' closed by pad
        (7, WordEnd(0.48)),  # next 0 at p=7: (8-2)/12.5
        (9, WordStart("d", 0.48)),
        (9, WordEnd(0.64)),
    ]


def test_tokens_inside_delay_are_ignored():
    words = WordAssembler(delay_frames=5, decode=str)
    assert [words.push(t, p) for p, t in enumerate([7, 0, 7, 0])] == [[], [], [], []]
