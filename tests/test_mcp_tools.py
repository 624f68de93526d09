"""MCP: a real MCP server built with the official SDK (tests/peers/mcp_inventory_server.py),
started by the test over stdio (and over streamable HTTP), whose tools the agent uses in a
conversation on the real Session (a scripted LLM double asks for them)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

from agent import Agent, ToolPolicy
from agent.toolkit.mcp_tools import MCPServerHTTP, MCPServerStdio
from helpers import free_port, wait_until
from llm.base import ToolCall
from test_tools_session import Script, converse, spoken, tool_messages, turn

SERVER = str(Path(__file__).parent / "peers" / "mcp_inventory_server.py")


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


async def test_an_agent_uses_a_streamable_http_mcp_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            with contextlib.suppress(OSError), __import__("socket").create_connection(("127.0.0.1", port), 0.2):
                return True
            return False

        assert await asyncio.to_thread(wait_until, listening, 60), "the MCP server did not start"
        agent = Agent(mcp_servers=[MCPServerHTTP(f"http://127.0.0.1:{port}/mcp")], tool_policy=ToolPolicy(filler_delay_s=5))
        script = Script(["any blue hats"], ask_stock("blue hat"))
        session, wav, llm, *_ = await converse(tmp_path, [turn(spoken())], script, agent)
        assert [m["content"] for m in tool_messages(llm.requests[1])] == ["0 blue hat in stock"]
    finally:
        proc.terminate()
        proc.wait(10)
