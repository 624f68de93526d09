"""Telling the bot's own voice, heard back, from the user's words (agent/conversation/echo.py)."""
from agent.conversation.echo import is_echo

STORY = ("Once upon a time there was a small fox who lived in a quiet wood, and every morning "
         "the fox went down to the river to drink")


def test_a_run_of_the_bots_recent_words_is_its_echo():
    assert is_echo("the fox went down to", STORY)
    assert is_echo("Fox went down, to the river.", STORY)  # case, punctuation
    assert is_echo("the fox went down to the liver", STORY)  # misheard a little: 6 of 7 in one run
    assert is_echo("drink", STORY)  # one word: among the very last said


def test_the_users_own_words_are_not():
    assert not is_echo("stop, wait a moment please", STORY)
    assert not is_echo("what did the fox do", STORY)  # shares words, but no run of most of them
    assert not is_echo("once", STORY)  # one word said long ago: a real "once" may cut
    assert not is_echo("the fox", "")  # nothing said yet
    assert not is_echo("", STORY)


def test_only_the_recent_words_count():
    long_ago = "a small fox who lived in a quiet wood"
    assert is_echo(long_ago, STORY)
    assert not is_echo(long_ago, STORY + " " + " ".join(["and then it swam"] * 10))
