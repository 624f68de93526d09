"""The default instructions say what to do with a statement (react, never say it back) and show
it in the chat's own turn layout: with the one-line prompt the bundled 0.5B model said 16 of 20
spoken statements and questions back in `duplex bench quality`, with these 4 (docs/quality.md)."""
from agent.conversation.config import SessionConfig
from agent.toolkit.voice_agent import DEFAULT_INSTRUCTIONS, Agent


def test_the_default_instructions_forbid_saying_the_users_sentence_back():
    assert "Never say the user's sentence back" in DEFAULT_INSTRUCTIONS
    assert "If the user tells you something" in DEFAULT_INSTRUCTIONS


def test_they_show_a_reaction_to_a_statement_and_an_answer_to_a_question_as_chat_turns():
    lines = DEFAULT_INSTRUCTIONS.splitlines()
    turns = [line.split(": ", 1)[0] for line in lines if line.startswith(("User: ", "Assistant: "))]
    assert turns == ["User", "Assistant", "User", "Assistant"]
    statement, question = lines[-4][len("User: "):], lines[-2][len("User: "):]
    assert statement.endswith(".") and question.endswith("?")


def test_the_default_agent_and_session_use_them():
    assert Agent().instructions == DEFAULT_INSTRUCTIONS == SessionConfig().system_prompt
