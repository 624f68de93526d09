"""`duplex bench quality`'s measures: when a reply echoes the user, and when a key word is heard."""
from agent.bench.quality import SPOKEN, VOICES, Clip, content_words, echoes, in_turn, key_heard, stock_phrase


def test_a_reply_that_says_the_users_words_back_echoes():
    assert echoes("He was not an old-sposed young man.", "He was not a young man.")
    assert echoes("The meeting got moved to Friday.", "The meeting was moved to Friday.")
    assert echoes("Go forward 10 meters.", "Going forward ten meters.")


def test_a_reply_that_answers_does_not_echo():
    assert not echoes("Why is the sky blue?", "The sky is blue because air scatters blue light more.")
    assert not echoes("I had a terrible day at work.", "I'm sorry. Do you want to talk about it?")
    assert not echoes("Go forward 10 meters.", "")  # no reply says nothing back


def test_content_words_drop_stop_words_and_endings():
    assert content_words("The cats were playing in the garden.") == ["cat", "play", "garden"]


def test_a_key_word_is_heard_as_a_whole_word_after_normalising():
    assert key_heard("sky", "Why is the sky blue?")
    assert not key_heard("sky", "Why is this guy blue?")
    assert key_heard("Romeo", "who wrote romeo and juliet")
    assert not key_heard("bees", "What do these make?")


def test_the_spoken_set_mixes_statements_and_questions_in_every_voice():
    kinds = [kind for _, _, kind in SPOKEN]
    assert 18 <= len(SPOKEN) <= 24 and kinds.count("statement") >= 8 and kinds.count("question") >= 8
    assert all(key_heard(key, text) for text, key, _ in SPOKEN)
    assert len(SPOKEN) >= 2 * len(VOICES)


def test_the_conversation_hears_each_sentence_once_in_the_voices_in_turn():
    """The recognizer part decodes every sentence in every voice; the conversation replays each
    sentence once, the voices taking turns, from the same clips."""
    clips = [Clip(f"s{i}:{v}", text, key, kind, None) for i, (text, key, kind) in enumerate(SPOKEN) for v in VOICES]
    script = in_turn(clips)
    assert [c.text for c in script] == [text for text, _, _ in SPOKEN]
    assert [c.name.split(":")[1] for c in script[:len(VOICES)]] == VOICES


def test_most_of_the_words_is_more_than_half_and_a_restated_question_with_its_answer_is_not_mostly_an_echo():
    from agent.bench.quality import echo_share, mostly_echoes

    restated = ("Who wrote Romeo and Juliet?", "Romeo and Juliet were written by Shakespeare.")
    assert echo_share(*restated) == 0.5 and echoes(*restated) and not mostly_echoes(*restated)
    assert mostly_echoes("Turn left at the next corner.", "Turn left at the next corner.")
    assert mostly_echoes("It is raining again.", "It's raining again.")
    assert not mostly_echoes("Go forward 10 meters.", "") and echo_share("Go forward 10 meters.", "") == 0.0


def test_a_reply_that_says_four_words_in_a_row_of_an_earlier_one_is_a_stock_phrase():
    earlier = ["That's great! Have a nice day.", "Tokyo."]
    assert stock_phrase("That's okay. Have a nice day!", earlier)
    assert not stock_phrase("That's great! Enjoy the trip.", earlier)  # three words are no formula
    assert not stock_phrase("Have a nice day.", [])
