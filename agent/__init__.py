"""duplex's agent: the conversation and the API to build one.

    from agent import Agent, function_tool

The names below load on first use, so that `duplex` commands that need none of them start fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Agent": "agent.toolkit.voice_agent", "load_agent": "agent.toolkit.voice_agent",
    "function_tool": "agent.toolkit.tools", "FunctionTool": "agent.toolkit.tools", "RunContext": "agent.toolkit.tools",
    "ToolError": "agent.toolkit.tools", "ToolPolicy": "agent.toolkit.tools",
    "end_call": "agent.toolkit.call_control", "MCPServerStdio": "agent.toolkit.mcp_tools", "MCPServerHTTP": "agent.toolkit.mcp_tools",
    "Session": "agent.conversation.session", "SessionConfig": "agent.conversation.config", "Models": "agent.conversation.config",
    "UserTurnFinal": "agent.conversation.session_events", "ReplyStarted": "agent.conversation.session_events",
    "ReplyFinished": "agent.conversation.session_events", "ToolCallStarted": "agent.conversation.session_events",
    "ToolCallFinished": "agent.conversation.session_events", "BargeIn": "agent.conversation.session_events",
    "SessionEnded": "agent.conversation.session_events", "DtmfReceived": "agent.conversation.session_events",
    "TurnConfig": "agent.conversation.turns", "EndOfTurnPolicy": "agent.conversation.endpointing", "CombinedPolicy": "agent.conversation.endpointing",
    "RulesPolicy": "agent.conversation.endpointing", "SmartTurnPolicy": "agent.conversation.endpointing", "SilencePolicy": "agent.conversation.endpointing",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
