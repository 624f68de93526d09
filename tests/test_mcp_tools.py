"""MCP: a real MCP server built with the official SDK (tests/peers/mcp_inventory_server.py),
started by the test over stdio (and over streamable HTTP), whose tools the agent uses in a
conversation on the real Session (a scripted LLM double asks for them). The conversation runs
on the virtual clock; the waits on the server's process, at the real pace."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent import Agent, ToolPolicy
from agent.toolkit.mcp_tools import MCPServer, MCPServerHTTP, MCPServerStdio
from helpers import await_until, free_port
from llm.base import ToolCall
from test_tools_session import Script, converse, spoken, tool_messages, turn

SERVER = str(Path(__file__).parent / "peers" / "mcp_inventory_server.py")


@pytest.fixture(autouse=True)
def mcp_in_real_time(virtual_clock, monkeypatch):
    """The conversation on the virtual clock, and the moments it waits on the MCP server's
    process at the real pace: connecting (the stdio server's start), each tool call, and the
    connection's close (the stdio server's exit)."""
    if virtual_clock is None:
        return
    from mcp import ClientSession

    def real_paced(method):
        async def paced(*args, **kwargs):
            with virtual_clock.real_time():
                return await method(*args, **kwargs)
        return paced

    class ClosedInRealTime(contextlib.AbstractAsyncContextManager):
        def __init__(self, client):
            self.client = client

        async def __aenter__(self):
            return await self.client.__aenter__()

        async def __aexit__(self, *exc):
            with virtual_clock.real_time():
                return await self.client.__aexit__(*exc)

    monkeypatch.setattr(MCPServer, "connect", real_paced(MCPServer.connect))
    monkeypatch.setattr(ClientSession, "call_tool", real_paced(ClientSession.call_tool))
    for cls in (MCPServerStdio, MCPServerHTTP):
        monkeypatch.setattr(cls, "_client", lambda self, client=cls._client: ClosedInRealTime(client(self)))


def ask_stock(item: str):
    return lambda user: [ToolCall("c1", "check_stock", json.dumps({"item": item}))]


async def test_an_agent_uses_a_stdio_mcp_servers_tool_in_a_conversation(tmp_path):
    agent = Agent(mcp_servers=[MCPServerStdio(sys.executable, [SERVER])], tool_policy=ToolPolicy(filler_delay_s=5))
    script = Script(["do you have red shoes", "and a blue hat"],
                    lambda user: [ToolCall("c1", "check_stock", json.dumps(
                        {"item": "red shoes" if "shoes" in user else "green socks"}))])
    session, wav, llm, tracer, _ = await converse(tmp_path, [turn(spoken()), turn(spoken(seed=4))], script, agent)
    assert llm.offered[0][0]["function"]["name"] == "check_stock"
    assert llm.offered[0][0]["function"]["parameters"]["properties"]["item"]["type"] == "string"
    first = tool_messages(llm.requests[1])
    assert [m["content"] for m in first] == ["3 red shoes in stock"]
    assert session.records[0].heard_text == "Done: 3 red shoes in stock."
    # the server's own error reaches the model as the tool's failure
    second = tool_messages(llm.requests[-1])[-1]
    assert "we do not sell green socks" in json.loads(second["content"])["error"]


async def test_an_unreachable_mcp_server_leaves_the_conversation_going(tmp_path):
    agent = Agent(mcp_servers=[MCPServerStdio(sys.executable, ["-c", "import sys; sys.exit(3)"],
                                              connect_timeout_s=5)])
    script = Script(["hello"], lambda user: ["Hi", " there."])
    session, wav, llm, *_ = await converse(tmp_path, [turn(spoken())], script, agent)
    assert session.records[0].heard_text == "Hi there." and llm.offered == [None]


async def test_an_agent_uses_a_streamable_http_mcp_server(tmp_path, virtual_clock):
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            with contextlib.suppress(OSError), __import__("socket").create_connection(("127.0.0.1", port), 0.2):
                return True
            return False

        with virtual_clock.real_time() if virtual_clock else contextlib.nullcontext():
            assert await await_until(listening, 60), "the MCP server did not start"
        agent = Agent(mcp_servers=[MCPServerHTTP(f"http://127.0.0.1:{port}/mcp")], tool_policy=ToolPolicy(filler_delay_s=5))
        script = Script(["any blue hats"], ask_stock("blue hat"))
        session, wav, llm, *_ = await converse(tmp_path, [turn(spoken())], script, agent)
        assert [m["content"] for m in tool_messages(llm.requests[1])] == ["0 blue hat in stock"]
    finally:
        proc.terminate()
        proc.wait(10)
