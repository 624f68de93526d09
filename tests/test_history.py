"""The history, pure: what was heard of a reply, the context, cut and resume."""
from agent.history import Heard, History, cut_reply


def story() -> Heard:
    h = Heard()
    h.sent(0, 0.0, "Once upon", clause="Once upon a time,")
    h.sent(1, 0.1, "a time,")
    h.sent(2, 0.2, "there was", clause="there was a fox.")
    h.sent(3, 0.3, "a fox.")
    return h


def test_heard_text_is_the_played_pieces_by_marks_or_by_time():
    h = story()
    h.played(0)
    h.played(1)
    assert h.text(h.played_ids) == "Once upon a time,"
    assert h.text(h.played_by_time(0.25)) == "Once upon a time, there was"
    assert h.text(set()) == ""


def test_a_cut_reply_resumes_from_the_clause_that_was_playing():
    h = story()
    cut = cut_reply(3, "tell me a story", "Once upon a time, there was a fox.", h, {0, 1, 2})
    assert cut.heard == "Once upon a time, there was"
    assert cut.heard_before_clause == "Once upon a time,"
    assert cut.rest == "there was a fox."
    assert cut_reply(3, "x", "", Heard(), set()) is None


def test_history_cuts_back_to_half_and_never_starts_with_an_answer():
    warmed = []
    hist = History(max_messages=4, on_new_prefix=lambda: warmed.append(1))
    for i in range(3):
        hist.remember(f"q{i}", f"a{i}")
    assert [m["content"] for m in hist.messages] == ["q2", "a2"]
    assert len(warmed) == 3
    hist.remember("", "hello")  # a greeting has no user message
    assert hist.messages[-1] == {"role": "assistant", "content": "hello"}
    assert hist.prompt("sys", "q")[0] == {"role": "system", "content": "sys"}
    assert hist.prompt("sys", "q")[-1] == {"role": "user", "content": "q"}


def test_forget_cut_drops_the_truncated_exchange_only():
    hist = History()
    hist.remember("hi", "hello")
    h = story()
    cut = cut_reply(1, "tell me a story", "Once upon a time, there was a fox.", h, {0})
    hist.remember(cut.user_text, cut.heard)
    hist.forget_cut(cut)
    assert hist.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
