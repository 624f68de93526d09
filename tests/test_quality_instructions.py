"""The default instructions say what to do with a statement (react, never say it back), and two
example exchanges show it as turns of the conversation: with the one-line prompt the bundled 0.5B
model said 16 of 20 spoken statements and questions back in `duplex bench quality`
(docs/quality.md)."""
from agent.conversation.config import SessionConfig
from agent.conversation.history import History
from agent.toolkit.voice_agent import DEFAULT_EXAMPLES, DEFAULT_INSTRUCTIONS, Agent


def test_the_default_instructions_forbid_saying_the_users_sentence_back():
    assert "Never say the user's sentence back" in DEFAULT_INSTRUCTIONS
    assert "If the user tells you something" in DEFAULT_INSTRUCTIONS


def test_the_examples_react_to_a_statement_and_answer_a_question_as_turns_before_the_conversation():
    (statement, _), (question, _) = DEFAULT_EXAMPLES
    assert statement.endswith(".") and question.endswith("?")
    history = History()
    history.remember("Hi there.", "Hello!")
    prompt = history.prompt(DEFAULT_INSTRUCTIONS, "What now?", Agent().example_messages())
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user", "assistant",
                                           "user", "assistant", "user"]
    assert prompt[1]["content"] == statement and prompt[-1]["content"] == "What now?"
    assert "User:" not in prompt[0]["content"]  # not lines of the instructions, which the model restated


def test_the_default_agent_and_session_use_them_and_an_agent_of_its_own_shows_its_own():
    assert Agent().instructions == DEFAULT_INSTRUCTIONS == SessionConfig().system_prompt
    assert Agent().examples == DEFAULT_EXAMPLES
    assert Agent(instructions="You book tables at Chez Louis.").examples == ()
    own = Agent(instructions="You book tables.", examples=[("A table for two.", "For what time?")])
    assert own.example_messages() == [{"role": "user", "content": "A table for two."},
                                      {"role": "assistant", "content": "For what time?"}]
