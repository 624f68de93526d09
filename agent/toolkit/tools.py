"""Tools an agent can call: plain Python functions, sync or async, marked with `@function_tool`.

A tool's JSON schema comes from its signature (pydantic builds and validates it) and its
docstring (docstring_parser reads the description and each argument's line), so the model sees
what the integrator wrote and a call with wrong arguments is answered with pydantic's error
instead of reaching the function. A parameter annotated `RunContext` receives the call's context
and is not shown to the model.

    @function_tool
    async def get_weather(city: str) -> str:
        '''Today's weather in a city.

        Args:
            city: the city's name, e.g. Paris
        '''
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import docstring_parser
import pydantic

from agent.workers import run_in


@dataclass(frozen=True)
class ToolPolicy:
    """How tool calls run inside a reply."""

    # said when a tool has not answered within `filler_delay_s`; () says nothing
    filler_phrases: tuple[str, ...] = ("One moment.", "Let me check that.")
    filler_delay_s: float = 1.0
    timeout_s: float = 10.0  # a tool's own `timeout_s` overrides it
    max_steps: int = 3  # rounds of tool calls in one reply; past them the model must answer
    # said when a reply ends with no words at all (the model called tools and then said nothing)
    no_answer: str = "Sorry, I couldn't get that done."
    # how the model reads results (llm.tool_results NATIVE or INLINE); None: the model's own
    # (`ChatModel.tool_results`: INLINE for models under 3B parameters), else NATIVE
    results: Any = None


class ToolError(Exception):
    """Raise it in a tool to tell the model, in words, why the call failed."""


@dataclass
class RunContext:
    """What a running tool can see and do: the call, the conversation's turn, and the session's
    actions (`session.say`, ...). `end_call()` ends the call once the reply's goodbye has played."""

    call_id: str
    tool: str
    turn: int
    session: Any = None  # the live agent.conversation.session.Session (None when a tool is called outside one)
    ends_call: bool = False

    def end_call(self) -> None:
        self.ends_call = True


@dataclass(frozen=True, eq=False)
class FunctionTool:
    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict  # the arguments' JSON schema
    # validates them; None: a tool described by its schema alone (an MCP server's), called with
    # the arguments' dict as its one parameter, its server validating them
    arguments: type[pydantic.BaseModel] | None = field(repr=False)
    context_param: str | None = None  # the parameter that receives the RunContext
    interruptible: bool = True  # False: a barge-in lets it finish (a payment, a booking)
    timeout_s: float | None = None  # None: the agent's ToolPolicy.timeout_s

    def spec(self) -> dict:
        """OpenAI's function-tool spec, which every backend here takes."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    async def invoke(self, arguments: dict, ctx: RunContext) -> str:
        """Validate `arguments` and call the function (a sync one on the tools' own threads);
        the result as the text the model reads. pydantic.ValidationError for bad arguments."""
        if self.arguments is None:
            return as_text(await self.fn(arguments))
        values = self.arguments.model_validate(arguments)
        kwargs = {name: getattr(values, name) for name in type(values).model_fields}
        if self.context_param:
            kwargs[self.context_param] = ctx
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**kwargs)
        else:
            result = await run_in("tools", lambda: self.fn(**kwargs))
            if inspect.isawaitable(result):
                result = await result
        return as_text(result)


def as_text(result: Any) -> str:
    if result is None:
        return "done"
    if isinstance(result, str):
        return result
    if isinstance(result, pydantic.BaseModel):
        return result.model_dump_json()
    return json.dumps(result, default=str)


def function_tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None,
                  interruptible: bool = True, timeout_s: float | None = None):
    """Mark a function as a tool: `@function_tool` or `@function_tool(interruptible=False, ...)`."""
    def make(f: Callable) -> FunctionTool:
        return build_tool(f, name=name, description=description, interruptible=interruptible, timeout_s=timeout_s)

    return make(fn) if fn is not None else make


def build_tool(fn: Callable, *, name: str | None = None, description: str | None = None,
               interruptible: bool = True, timeout_s: float | None = None) -> FunctionTool:
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    arg_docs = {p.arg_name: p.description for p in doc.params}
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(pname, str)
        if annotation is RunContext:
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args and **kwargs cannot be described to a model")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, pydantic.Field(default, description=arg_docs.get(pname)))
    tool_name = name or fn.__name__
    model = pydantic.create_model(f"{tool_name}_arguments", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)  # the model reads the name already; shorter prompts answer sooner
    text = description or "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
    return FunctionTool(fn, tool_name, text or tool_name, schema, model, context_param, interruptible, timeout_s)
