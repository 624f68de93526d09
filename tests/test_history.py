"""The history, pure: what was heard of a reply, and the context."""
from agent.conversation.history import Heard, History, as_written


def story() -> Heard:
    h = Heard()
    h.sent(0, 0.0, "Once upon")
    h.sent(1, 0.1, "a time,")
    h.sent(2, 0.2, "there was")
    h.sent(3, 0.3, "a fox.")
    return h


def test_heard_text_is_the_played_pieces_by_marks_or_by_time():
    h = story()
    h.played(0)
    h.played(1)
    assert h.text(h.played_ids) == "Once upon a time,"
    assert h.text(h.played_by_time(0.25)) == "Once upon a time, there was"
    assert h.text(set()) == ""


def test_pieces_a_clear_dropped_were_not_heard_and_their_resend_counts_once():
    h = story()
    h.played(0)
    h.played(1)
    h.played(2)  # a mark that came in just before the clear
    h.dropped({2, 3})  # a resume sends them again under new ids
    assert h.text(h.played_ids) == "Once upon a time,"
    assert h.text(h.played_by_time(0.35)) == "Once upon a time,"
    h.sent(7, 0.2, "there was")
    h.sent(8, 0.3, "a fox.")
    h.played(7)
    assert h.text(h.played_ids) == "Once upon a time, there was"
    assert h.text({cid for cid, _, _ in h.pieces}) == "Once upon a time, there was a fox."


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
    assert hist.prompt("sys", "q")[-1] == {"role": "user", "content": "Q."}


def test_a_history_of_the_bot_alone_keeps_its_last_words_when_cut():
    """`say` after `say` with no user between: the cut keeps the latest of them (an orphaned tool
    result never opens the context)."""
    hist = History(max_messages=4)
    for i in range(5):
        hist.remember("", f"notice {i}")
    assert [m["content"] for m in hist.messages] == ["notice 3", "notice 4"]
    hist = History(max_messages=4)
    hist.remember("", "first")
    hist.remember("", "second")
    hist.remember_reply("", [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                             {"role": "assistant", "content": "done"}])  # cut to [result, "done"]
    assert [m["role"] for m in hist.messages] == ["assistant"] and hist.messages[0]["content"] == "done"


def test_the_model_reads_the_users_words_written_out_and_the_history_keeps_them_as_heard():
    """Whisper writes some finals and every partial bare; the model reads each user turn as a
    sentence, a question when it opens like one, and the history keeps the words as heard."""
    assert as_written("turn left at the next corner") == "Turn left at the next corner."
    assert as_written("who wrote romeo and juliet") == "Who wrote romeo and juliet?"
    assert as_written("i think i'm lost,") == "I think I'm lost."
    assert as_written("What now?") == "What now?" and as_written("Well...") == "Well..."
    assert as_written("  ") == ""
    hist = History()
    hist.remember("it is raining again", "Take an umbrella!")
    prompt = hist.prompt("sys", "can you stop")
    assert [m["content"] for m in prompt] == ["sys", "It is raining again.", "Take an umbrella!", "Can you stop?"]
    assert hist.messages[0] == {"role": "user", "content": "it is raining again"}
