"""A reply may not copy `n` tokens in a row of an earlier reply, nor of itself (llm/no_repeat.py)."""
import numpy as np

from llm.no_repeat import NoRepeat, earlier_replies


def test_the_token_that_would_complete_a_copied_run_is_banned():
    rule = NoRepeat([[1, 2, 3, 4, 5, 6, 7]], n=4)
    assert rule.banned([9, 9, 1, 2, 3]) == {4}  # "1 2 3" then "4" would copy four in a row
    assert rule.banned([9, 4, 5, 6]) == {7}
    assert rule.banned([9, 9, 1, 2]) == set()  # three in a row are free
    assert rule.banned([1, 3, 2]) == set()


def test_every_earlier_reply_counts_and_a_run_may_go_on_differently():
    rule = NoRepeat([[1, 2, 3, 4], [1, 2, 3, 8]], n=4)
    assert rule.banned([1, 2, 3]) == {4, 8}
    assert NoRepeat([], n=4).banned([1, 2, 3]) == set()


def test_as_a_logits_processor_it_rules_out_only_the_banned_tokens():
    process = NoRepeat([[1, 2, 3, 4]], n=4).logits_processor()
    scores = process(np.array([7, 1, 2, 3]), np.zeros(10, np.float32))
    assert scores[4] == -np.inf and np.isfinite(np.delete(scores, 4)).all()


def test_the_earlier_replies_are_the_assistants_texts():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello there!"},
                {"role": "assistant", "content": None, "tool_calls": []}, {"role": "user", "content": "Bye"}]
    assert earlier_replies(messages) == ["Hello there!"]


def test_a_reply_may_not_loop_on_its_own_words_but_the_prompt_is_not_the_reply():
    # 'Check out "The Legend of Zelda: The Legend of Zelda: ...': the first call's ids are the
    # prompt, and a run the prompt holds is free (the user's words, the instructions)
    process = NoRepeat([], n=4).logits_processor()
    prompt = [5, 6, 7, 8, 5, 6, 7]
    assert np.isfinite(process(np.array(prompt), np.zeros(10, np.float32))).all()
    reply = [1, 2, 3, 9, 1, 2, 3]  # "1 2 3" then "9" would say four of its own tokens again
    scores = process(np.array(prompt + reply), np.zeros(10, np.float32))
    assert scores[9] == -np.inf and np.isfinite(np.delete(scores, 9)).all()
    assert NoRepeat([], n=4).banned_in_itself([1, 2, 3, 4, 2, 3]) == set()  # a run of two again is free


def test_where_tools_are_offered_a_reply_may_repeat_its_own_form():
    # two calls in one reply share their form ('</tool_call> <tool_call> {"name": ...')
    process = NoRepeat([], n=4, itself=False).logits_processor()
    process(np.array([5]), np.zeros(10, np.float32))
    assert np.isfinite(process(np.array([5, 1, 2, 3, 9, 1, 2, 3]), np.zeros(10, np.float32))).all()
