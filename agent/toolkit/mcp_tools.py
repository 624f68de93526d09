"""MCP servers as a source of tools, through the official `mcp` SDK.

    Agent(..., mcp_servers=[MCPServerStdio("python", ["my_server.py"]),
                            MCPServerHTTP("http://127.0.0.1:9000/mcp")])

Each conversation connects when it begins (its session's exit stack holds the connection and
closes it, and a stdio server's process, when the call ends) and lists the server's tools, which
join the agent's under their own names. The server validates the arguments against the schema it
published; an error it reports reaches the model as the tool's failure.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.toolkit.tools import FunctionTool, ToolError


@dataclass(kw_only=True)
class MCPServer:
    connect_timeout_s: float = 10.0
    interruptible: bool = True  # the tools' default (a server's tools may book or pay)
    timeout_s: float | None = None  # per call; None: the agent's ToolPolicy.timeout_s

    def _client(self):
        raise NotImplementedError

    async def connect(self, stack: contextlib.AsyncExitStack) -> list[FunctionTool]:
        from mcp import ClientSession

        async with asyncio.timeout(self.connect_timeout_s):
            streams = await stack.enter_async_context(self._client())
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            listed = await session.list_tools()
        return [self._tool(session, t) for t in listed.tools]

    def _tool(self, session, spec) -> FunctionTool:
        async def call(arguments: dict) -> str:
            result = await session.call_tool(spec.name, arguments)
            content = getattr(result, "content", None) or []
            text = "\n".join(c.text for c in content if getattr(c, "text", None))
            if not text and getattr(result, "structured_content", None) is not None:
                text = json.dumps(result.structured_content)
            if getattr(result, "is_error", False):
                raise ToolError(text or f"{spec.name} failed")
            return text

        schema = dict(spec.input_schema or {"type": "object", "properties": {}})
        return FunctionTool(call, spec.name, spec.description or spec.name, schema, None,
                            interruptible=self.interruptible, timeout_s=self.timeout_s)


@dataclass
class MCPServerStdio(MCPServer):
    """A server the conversation starts as a process and talks to over its stdin and stdout."""

    command: str = ""
    args: Sequence[str] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None

    def _client(self):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        return stdio_client(StdioServerParameters(command=self.command, args=list(self.args), env=self.env,
                                                  cwd=self.cwd))

    def __str__(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass
class MCPServerHTTP(MCPServer):
    """A server reached over MCP's streamable HTTP transport."""

    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def _client(self):
        from mcp.client.streamable_http import streamable_http_client

        if not self.headers:
            return streamable_http_client(self.url)
        import httpx2  # the SDK's own HTTP client, here with the headers (an API key)

        return streamable_http_client(self.url, http_client=httpx2.AsyncClient(headers=self.headers))

    def __str__(self) -> str:
        return self.url
