"""One reply's tool calls: run once each, bound to the reply that asked for them.

The reply calls `run` only once it is committed (a speculation waits at its gate first), so a
guess that is cancelled never runs a tool. Every call belongs to this object, which belongs to
one reply: nothing a cancelled reply asked for can run later. The same call (name and
arguments) asked twice in one reply runs once, and the second gets the first's result.

Cancellation (a barge-in): interruptible tools are cancelled; the others finish, and their
result reaches the history when it comes (`history_messages` hands their messages over with the
tasks, which the history waits for before the next prompt). A tool that fails, times out or gets
bad arguments is answered to the model as an error in words, so the model can tell the user.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pydantic

from agent.conversation.history import CANCELLED
from agent.conversation.session_events import ToolCallFinished, ToolCallStarted
from agent.toolkit.tools import FunctionTool, RunContext, ToolError, ToolPolicy
from agent.tracing.trace import Ev, Stage
from llm.base import Message, ToolCall, assistant_calls, tool_result

log = logging.getLogger("duplex.tools")



def _error(text: str) -> str:
    return json.dumps({"error": text})


@dataclass
class ToolStep:
    """One round of calls the model made, and what became of them."""

    calls: list[ToolCall]
    results: dict[str, str] = field(default_factory=dict)  # call id -> what the model reads
    still_running: dict[str, asyncio.Task] = field(default_factory=dict)  # uninterruptible, after a cut
    words_before: int = 0  # words of the reply said (sent to the voice) by the end of this round


class ReplyTools:
    def __init__(self, tools: dict[str, FunctionTool], policy: ToolPolicy, tracer, turn: int,
                 notify: Callable[[object], None], session=None):
        self.tools, self.policy, self.tracer = tools, policy, tracer
        self.turn = turn  # the reply's turn (a speculation's is renumbered when committed: Reply.commit)
        self._notify = notify  # typed session events (agent.conversation.session_events)
        self._session = session
        self.steps: list[ToolStep] = []
        # (name, arguments) -> its one run: running, then its result. An ended task is not kept:
        # a cancelled one's error holds the frames that refer to this object (a cycle)
        self._running: dict[tuple[str, str], asyncio.Task] = {}
        self._results: dict[tuple[str, str], str] = {}
        self.ends_call = False  # a tool asked to end the call once this reply has played
        self.refused = 0  # calls past max_steps, not run
        self._fillers = 0

    def specs(self) -> list[dict]:
        return [t.spec() for t in self.tools.values()]

    def may_run(self) -> bool:
        return len(self.steps) < self.policy.max_steps

    def refuse(self, calls: list[ToolCall], why: str) -> None:
        self.refused += len(calls)
        for call in calls:
            self.tracer.instant(Stage.TOOL, Ev.TOOL_REFUSED, turn=self.turn, tool=call.name, why=why)

    async def run(self, calls: list[ToolCall], said_words: Callable[[], int]) -> list[Message]:
        """Run this round's calls; returns the tool messages for the model, in the order of the
        calls. `said_words`: the reply's words sent to the voice so far (where the round falls
        in what is heard)."""
        step = ToolStep(calls, words_before=said_words())
        self.steps.append(step)
        keys = {call.id: (call.name, _canonical(call.arguments)) for call in calls}
        for call in calls:
            key = keys[call.id]
            if key in self._running or key in self._results:
                self.tracer.instant(Stage.TOOL, Ev.TOOL_REUSED, turn=self.turn, tool=call.name)
            else:
                self._running[key] = asyncio.create_task(self._execute(call), name=f"tool-{call.name}")
        try:
            if pending := {self._running[k] for k in keys.values() if k in self._running}:
                await asyncio.wait(pending)
        except asyncio.CancelledError:
            await self._cut(step, keys)
            raise
        finally:
            step.words_before = said_words()
            self._settle()
        step.results = {cid: self._results[key] for cid, key in keys.items()}
        return [tool_result(call, step.results[call.id]) for call in calls]

    def _settle(self) -> None:
        """Keep the results of the runs that ended; let their tasks go."""
        for key, task in list(self._running.items()):
            if task.done():
                del self._running[key]
                if not task.cancelled():
                    self._results[key] = task.result()

    def filler(self) -> str | None:
        """The next filler phrase (they take turns), traced; None when the agent has none."""
        phrases = self.policy.filler_phrases
        if not phrases:
            return None
        phrase = phrases[self._fillers % len(phrases)]
        self._fillers += 1
        self.tracer.instant(Stage.TOOL, Ev.FILLER, turn=self.turn, text=phrase)
        return phrase

    async def _cut(self, step: ToolStep, keys: dict[str, tuple[str, str]]) -> None:
        """The reply is cancelled mid-round: interruptible calls stop, the others go on."""
        stopping = []
        for call in step.calls:
            key = keys[call.id]
            task = self._running.get(key)
            tool = self.tools.get(call.name)
            if key in self._results:
                step.results[call.id] = self._results[key]
            elif task is None:
                continue  # a run asked twice in this round, cancelled already
            elif task.done() and not task.cancelled():
                step.results[call.id] = task.result()
            elif tool is not None and not tool.interruptible:
                step.still_running[call.id] = task
            else:
                task.cancel()
                stopping.append(task)
        if stopping:  # a tool that ignores its cancellation is not waited for long
            await asyncio.wait(stopping, timeout=1.0)

    async def _execute(self, call: ToolCall) -> str:
        tool = self.tools.get(call.name)
        refusal = None
        if tool is None:
            known = ", ".join(self.tools) or "none"
            refusal = (f"there is no tool named {call.name!r} (the tools are: {known})"
                       if call.name else f"malformed tool call: {call.arguments[:200]}")
        else:
            try:
                args = call.args()
            except ValueError as e:
                refusal = f"the arguments are not a JSON object: {e}"
        if refusal is not None:  # answered to the model, and told to the program like any call
            self._notify(ToolCallStarted(self.turn, call.id, call.name, {}))
            self._notify(ToolCallFinished(self.turn, call.id, call.name, "error", _error(refusal)))
            return _error(refusal)
        ctx = RunContext(call.id, tool.name, self.turn, self._session)
        timeout = tool.timeout_s if tool.timeout_s is not None else self.policy.timeout_s
        span = self.tracer.begin(Stage.TOOL, Ev.TOOL_CALL, turn=self.turn, tool=tool.name,
                                 arguments=call.arguments[:500])
        self._notify(ToolCallStarted(self.turn, call.id, tool.name, args))
        status, result = "error", ""
        try:
            async with asyncio.timeout(timeout):
                result = await tool.invoke(args, ctx)
            status = "ok"
        except TimeoutError:
            result = _error(f"{tool.name} timed out after {timeout:g} s")
        except pydantic.ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, p['loc'])) or 'arguments'}: {p['msg']}" for p in e.errors())
            result = _error(f"invalid arguments: {problems}")
        except ToolError as e:
            result = _error(str(e))
        except asyncio.CancelledError:
            status, result = "cancelled", CANCELLED
            raise
        except Exception as e:  # noqa: BLE001 - a tool's failure is the model's to explain
            log.warning("tool %s failed: %s", tool.name, e, exc_info=True)
            result = _error(f"{tool.name} failed: {type(e).__name__}: {e}"[:500])
        finally:
            self.tracer.end(span, status=status, result=result[:200])
            self._notify(ToolCallFinished(self.turn, call.id, tool.name, status, result))
        if ctx.ends_call:
            self.ends_call = True
        return result

    def history_messages(self, heard: str) -> tuple[list[Message], list[tuple[Message, asyncio.Task]]]:
        """The reply as the history keeps it: for each round, what was heard before its calls
        went on (with the calls) and their results, then the rest of what was heard. Calls
        still running come back with their (empty) messages, to be filled when they end."""
        words = heard.split()
        out: list[Message] = []
        waiting: list[tuple[Message, asyncio.Task]] = []
        pos = 0
        for step in self.steps:
            end = max(pos, min(step.words_before, len(words)))
            out.append(assistant_calls(" ".join(words[pos:end]), step.calls))
            pos = end
            for call in step.calls:
                if call.id in step.results:
                    out.append(tool_result(call, step.results[call.id]))
                elif call.id in step.still_running:
                    message = tool_result(call, "")
                    out.append(message)
                    waiting.append((message, step.still_running[call.id]))
                else:
                    out.append(tool_result(call, CANCELLED))
        if rest := " ".join(words[pos:]):
            out.append({"role": "assistant", "content": rest})
        return out, waiting


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except ValueError:
        return arguments
