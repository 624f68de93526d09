"""What an integrator writes: an `Agent` with instructions, tools, a greeting and hooks.

    agent = Agent(instructions="You book tables at Chez Louis.", tools=[book_table, end_call])
    duplex serve --agent my_module:agent

`Agent()` with nothing set is duplex's default assistant. Hooks are methods to override in a
subclass; each gets the live session (`agent.conversation.session.Session`), whose `say`, `generate_reply`
and `on(...)` are the agent's actions and events.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.toolkit.tools import FunctionTool, ToolPolicy, build_tool

# A small model says a statement back ("The meeting got moved to Friday." -> "The meeting was
# moved to Friday.") unless it is told what to do with one and shown how. The examples go in as
# turns of the conversation before the user's first: shown as lines of the instructions, they
# were restated ("The capital of Japan is Tokyo.") and their tip copied into unrelated replies
# (docs/quality.md, `duplex bench quality`); as turns, the no-repeat rule keeps them uncopied.
DEFAULT_INSTRUCTIONS = (
    "You are a friendly voice assistant in a spoken conversation. If the user asks something, "
    "answer it. If the user tells you something, react like a friend would: give your opinion, a "
    "tip, or ask a short question about it. Never say the user's sentence back. Reply in one or "
    "two short, plain English sentences.")
DEFAULT_EXAMPLES = (  # (user, assistant): a statement reacted to, a question answered
    ("I lost my keys again.", "That's annoying! Try the last place you sat down."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci."),
)


@dataclass
class Agent:
    instructions: str = DEFAULT_INSTRUCTIONS
    # example exchanges shown to the model before the conversation; the default ones go only
    # with the default instructions (an agent of its own shows its own, or none)
    examples: Sequence[tuple[str, str]] | None = None
    tools: Sequence[FunctionTool | Any] = ()  # FunctionTools; plain functions are made into tools
    greeting: str | None = None  # said as soon as the caller's audio arrives
    mcp_servers: Sequence[Any] = ()  # agent.toolkit.mcp_tools.MCPServer: their tools join `tools`
    tool_policy: ToolPolicy = field(default_factory=ToolPolicy)

    def __post_init__(self) -> None:
        if self.examples is None:
            self.examples = DEFAULT_EXAMPLES if self.instructions == DEFAULT_INSTRUCTIONS else ()
        self.examples = tuple((str(user), str(reply)) for user, reply in self.examples)
        self.tools = tuple(t if isinstance(t, FunctionTool) else build_tool(t) for t in self.tools)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"two tools share a name: {names}")

    def example_messages(self) -> list[dict]:
        """The examples as the chat's turns, after the instructions and before the conversation."""
        return [{"role": role, "content": text} for pair in self.examples
                for role, text in zip(("user", "assistant"), pair)]

    # ---- hooks (override in a subclass) ----------------------------------------------------------
    async def on_enter(self, session) -> None:
        """The conversation has begun (before the greeting)."""

    async def on_user_turn(self, session, text: str) -> None:
        """The user's turn is final with `text`, before the reply is committed."""

    async def on_exit(self, session) -> None:
        """The conversation has ended."""


def load_agent(spec: str) -> Agent:
    """`MODULE:ATTR` or `path/to/file.py:ATTR` -> the Agent there (ATTR may be a function that
    returns one)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SystemExit(f"--agent {spec!r}: expected MODULE:ATTR or FILE.py:ATTR")
    if target.endswith(".py"):
        path = Path(target).resolve()
        name = f"duplex_agent_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise SystemExit(f"--agent {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    value = getattr(module, attr)
    if not isinstance(value, Agent) and callable(value):
        value = value()
    if not isinstance(value, Agent):
        raise SystemExit(f"--agent {spec!r} is a {type(value).__name__}, not an agent.Agent")
    return value
