"""Tool calls in the LLM vocabulary: the `<tool_call>` tags Qwen2.5's chat template asks for,
parsed while they stream (text before a call is said at once, a call's JSON never is), and
OpenAI's streamed `tool_calls` deltas, through the real `openai` client reading a recorded stream
in OpenAI's documented format from a loopback HTTP peer. Model-free."""
from __future__ import annotations

import asyncio
import json

import pytest

from agent import function_tool
from llm.base import ToolCall
from llm.openai_compat import OpenAICompatChat
from llm.tool_format import ToolCallText, template_messages


def feed(deltas: list[str]) -> list:
    parser = ToolCallText()
    out = []
    for d in deltas:
        out.extend(parser.push(d))
    return out + parser.flush()


def text_of(items) -> str:
    return "".join(i for i in items if isinstance(i, str))


def test_text_before_a_call_leaves_at_once_and_the_call_is_never_text():
    parser = ToolCallText()
    assert parser.push("Let me check. ") == ["Let me check. "]
    assert parser.push("<tool") == []  # could be a tag: held back
    assert parser.push('_call>\n{"name": "get_weather", ') == []
    out = parser.push('"arguments": {"city": "Paris"}}\n</tool_call>')
    (call,) = out
    assert isinstance(call, ToolCall) and call.name == "get_weather" and call.args() == {"city": "Paris"}
    assert parser.flush() == []


def test_a_tag_split_into_single_characters_is_parsed_the_same():
    stream = 'Sure.<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    items = feed(list(stream))
    assert text_of(items) == "Sure."
    assert [(c.name, c.args()) for c in items if isinstance(c, ToolCall)] == [("a", {}), ("b", {"x": 1})]
    assert len({c.id for c in items if isinstance(c, ToolCall)}) == 2


def test_text_that_only_looks_like_a_tag_is_said():
    assert text_of(feed(["1 <", " 2 and a <tool", "box>"])) == "1 < 2 and a <toolbox>"


def test_an_unclosed_call_at_the_end_is_still_a_call_and_garbage_is_a_malformed_one():
    (call,) = feed(['<tool_call>{"name": "end_call", "arguments": {}}'])
    assert call.name == "end_call"
    (bad,) = feed(["<tool_call>not json</tool_call>"])
    assert bad.name == "" and bad.arguments == "not json"
    (stringly,) = feed(['<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>'])
    assert stringly.args() == {"a": 2}


def test_templates_read_arguments_as_objects():
    call = ToolCall("c1", "f", '{"a": 1}')
    (m,) = template_messages([{"role": "assistant", "content": "", "tool_calls": [call.as_message_part()]}])
    assert m["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_a_tools_schema_comes_from_its_signature_and_docstring():
    @function_tool(interruptible=False)
    def book(party: int, day: str = "today") -> str:
        """Book a table.

        Args:
            party: how many people
            day: which day
        """
        return "ok"

    spec = book.spec()["function"]
    assert spec["description"] == "Book a table." and not book.interruptible
    assert spec["parameters"]["required"] == ["party"]
    assert spec["parameters"]["properties"]["party"] == {"type": "integer", "description": "how many people"}
    assert spec["parameters"]["properties"]["day"]["default"] == "today"


# ---- OpenAI's streamed tool_calls, from a recorded stream ----------------------------------------
def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


# the shape OpenAI documents for a streamed function call: the id and name first, the arguments
# in fragments, two calls by index, and a text delta before them
RECORDED = [
    _chunk({"role": "assistant", "content": "One moment. "}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Paris\"}"}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_def", "type": "function",
                            "function": {"name": "get_time", "arguments": "{}"}}]}),
    _chunk({}, finish="tool_calls"),
]


async def _replay(chunks: list[dict]):
    """A loopback HTTP peer that answers any request with `chunks` as server-sent events."""
    seen = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        seen.append(json.loads(await reader.readexactly(length)) if length else None)
        body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


async def test_streamed_tool_call_deltas_are_put_together():
    server, seen = await _replay(RECORDED)
    port = server.sockets[0].getsockname()[1]
    try:
        llm = OpenAICompatChat(f"http://127.0.0.1:{port}/v1", model="m")
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        items = [i async for i in llm.stream([{"role": "user", "content": "weather?"}], tools=tools)]
    finally:
        server.close()
    assert seen[0]["tools"] == tools, "the tools went into the request"
    assert text_of(items) == "One moment. "
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert [(c.id, c.name, c.args()) for c in calls] == [("call_abc", "get_weather", {"city": "Paris"}),
                                                         ("call_def", "get_time", {})]


async def test_a_server_passing_the_tags_through_as_text_still_gives_calls():
    tagged = [_chunk({"content": "Sure. <tool_"}), _chunk({"content": 'call>{"name": "f", "arguments": {}}</tool_call>'})]
    server, _ = await _replay(tagged)
    port = server.sockets[0].getsockname()[1]
    try:
        llm = OpenAICompatChat(f"http://127.0.0.1:{port}/v1", model="m")
        items = [i async for i in llm.stream([{"role": "user", "content": "x"}],
                                             tools=[{"type": "function", "function": {"name": "f"}}])]
    finally:
        server.close()
    assert text_of(items) == "Sure. " and [c.name for c in items if isinstance(c, ToolCall)] == ["f"]


@pytest.mark.parametrize("chunks", [RECORDED[:1]])
async def test_without_tools_a_stream_is_text_as_before(chunks):
    server, seen = await _replay(chunks)
    port = server.sockets[0].getsockname()[1]
    try:
        llm = OpenAICompatChat(f"http://127.0.0.1:{port}/v1", model="m")
        items = [i async for i in llm.stream([{"role": "user", "content": "x"}])]
    finally:
        server.close()
    assert items == ["One moment. "] and "tools" not in seen[0]


def test_a_call_written_without_its_tags_is_a_call_and_other_braces_are_text():
    # Qwen2.5-Coder-0.5B through its own template writes the JSON alone
    items = feed(['{"', 'name', '": "get', '_weather", "arguments": {"city": "Pa', 'ris"}}'])
    (call,) = items
    assert call.name == "get_weather" and call.args() == {"city": "Paris"}
    items = feed(["Sure.\n", '{"name": "get_time", "arguments": {"city": "Rome"}}'])
    assert text_of(items) == "Sure.\n" and [c.name for c in items if isinstance(c, ToolCall)] == ["get_time"]
    assert text_of(feed(['{"a": "}"} is ', "a set"])) == '{"a": "}"} is a set'
    assert text_of(feed(["Use {braces} here."])) == "Use {braces} here."


def test_a_call_cut_off_mid_object_is_a_malformed_call_not_speech():
    (bad,) = feed(['{"name": "joke", "arguments": {"message": "Why did'])
    assert isinstance(bad, ToolCall) and bad.name == ""


def test_inline_results_fold_each_round_into_the_turn_that_asked():
    from llm.base import assistant_calls, tool_result
    from llm.tool_results import INLINE, NATIVE

    call = ToolCall("c1", "get_weather", '{"city": "Paris"}')
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "weather in Paris?"},
                assistant_calls("Let me see.", [call]), tool_result(call, "sunny"),
                {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "thanks"}]
    assert NATIVE.prepare(messages) is messages
    assert INLINE.prepare(messages, tools_offered=False) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "weather in Paris?\n\n(get_weather returned: sunny)"},
        {"role": "assistant", "content": "Let me see. It is sunny."}, {"role": "user", "content": "thanks"}]
    # the turn being answered: its results in the system prompt
    answering = messages[:4]
    assert INLINE.prepare(answering, tools_offered=False) == [
        {"role": "system", "content": "S\n\nget_weather returned: sunny"},
        {"role": "user", "content": "weather in Paris?"}, {"role": "assistant", "content": "Let me see."}]
    assert not INLINE.chains and NATIVE.chains


def test_a_small_models_tool_round_reads_the_earlier_turns_as_a_transcript():
    from llm.base import assistant_calls, tool_result
    from llm.tool_results import INLINE

    call = ToolCall("c1", "get_weather", '{"city": "Paris"}')
    messages = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "Hello, how can I help?"},
                {"role": "user", "content": "weather in Paris?"}, assistant_calls("", [call]),
                tool_result(call, "sunny"), {"role": "assistant", "content": "It is sunny."},
                {"role": "user", "content": "and the time?"}]
    assert INLINE.prepare(messages) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "The conversation so far:\nYou: Hello, how can I help?\nCaller: weather in Paris?\n"
                                    "(get_weather returned: sunny)\nYou: It is sunny.\n\nThe caller now says: and the time?"}]
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert INLINE.prepare(first) == first


async def test_a_server_that_ignores_max_tokens_is_not_read_for_ever():
    endless = [_chunk({"content": f" w{i}"}) for i in range(500)]
    server, _ = await _replay(endless)
    port = server.sockets[0].getsockname()[1]
    try:
        llm = OpenAICompatChat(f"http://127.0.0.1:{port}/v1", model="m")
        items = [i async for i in llm.stream([{"role": "user", "content": "x"}], max_tokens=10)]
    finally:
        server.close()
    assert 10 <= len(items) <= 11, len(items)
