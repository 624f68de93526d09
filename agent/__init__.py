"""duplex's agent: the conversation and the API to build one.

    from agent import Agent, function_tool

The names below load on first use, so that `duplex` commands that need none of them start fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Agent": "agent.voice_agent", "load_agent": "agent.voice_agent",
    "function_tool": "agent.tools", "FunctionTool": "agent.tools", "RunContext": "agent.tools",
    "ToolError": "agent.tools", "ToolPolicy": "agent.tools",
    "end_call": "agent.call_control", "MCPServerStdio": "agent.mcp_tools", "MCPServerHTTP": "agent.mcp_tools",
    "Session": "agent.session", "SessionConfig": "agent.config", "Models": "agent.config",
    "UserTurnFinal": "agent.session_events", "ReplyStarted": "agent.session_events",
    "ReplyFinished": "agent.session_events", "ToolCallStarted": "agent.session_events",
    "ToolCallFinished": "agent.session_events", "BargeIn": "agent.session_events",
    "SessionEnded": "agent.session_events", "DtmfReceived": "agent.session_events",
    "TurnConfig": "agent.turns", "EndOfTurnPolicy": "agent.endpointing", "CombinedPolicy": "agent.endpointing",
    "RulesPolicy": "agent.endpointing", "SmartTurnPolicy": "agent.endpointing", "SilencePolicy": "agent.endpointing",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
