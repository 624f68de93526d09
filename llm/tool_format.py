"""Tool calls written as text, the way Qwen2.5 and Hermes-style chat templates ask for them:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, parsed while the text streams.

Pure code. `ToolCallText.push(delta)` returns what can be said at once and the calls completed
so far: text before a call leaves as soon as it cannot be the start of a tag, and nothing
between the tags is ever returned as text. The embedded llama.cpp model, the transformers
backend and OpenAI-compatible servers that pass the tags through as content all use it.
"""
from __future__ import annotations

import json
import re
import uuid

from llm.base import Delta, Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:16]}"


def _held_back(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_call(body: str) -> ToolCall:
    """One call's JSON as the model wrote it. A body that is not a call keeps its text as the
    arguments under the name "" (the tool runner answers the model that it was malformed)."""
    body = body.strip()
    if body.startswith("{{") and body.endswith("}}"):
        body = body[1:-1]  # Qwen2.5-Coder-1.5B copies its template's doubled braces
    try:
        value = json.loads(body)
    except ValueError:
        return ToolCall(new_call_id(), "", body)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(new_call_id(), "", body.strip())
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        return ToolCall(new_call_id(), value["name"], args)
    return ToolCall(new_call_id(), value["name"], json.dumps(args))


def _names_a_call(body: str) -> bool:
    """A broken object that began as a call (a model cut off mid-call): a malformed call, never
    text to say."""
    return re.match(r'\s*\{\{?\s*"name"\s*:', body) is not None


def _object_end(text: str) -> int:
    """The index just past the JSON object `text` starts with, or -1 while it is unfinished."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


class ToolCallText:
    """Small models often write a call's JSON without the tags (Qwen2.5-Coder-0.5B does, through
    its own template): an object that opens a line and reads as a call is one too. Text that
    opens a line with "{" is held until the object closes, then said if it is not a call."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False
        self._line_start = True  # nothing but whitespace since the answer or a line began

    def push(self, delta: str) -> list[Delta]:
        self._buf += delta
        out: list[Delta] = []
        while True:
            if self._inside:
                end = self._buf.find(CLOSE)
                if end < 0:
                    return out
                out.append(parse_call(self._buf[:end]))
                self._buf, self._inside = self._buf[end + len(CLOSE):], False
                continue
            if self._line_start and self._buf.lstrip().startswith("{"):
                lead = len(self._buf) - len(self._buf.lstrip())
                end = _object_end(self._buf[lead:])
                if end < 0:
                    return out
                body, self._buf = self._buf[lead:lead + end], self._buf[lead + end:]
                call = parse_call(body)
                out.append(call if call.name or _names_a_call(body) else self._said(body))
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                if start:
                    out.append(self._said(self._buf[:start]))
                self._buf, self._inside = self._buf[start + len(OPEN):], True
                continue
            keep = _held_back(self._buf, OPEN)
            text = self._buf[:len(self._buf) - keep]
            if not text.strip() and self._line_start:
                return out  # whitespace at a line's start: wait to see whether an object follows
            if text:
                out.append(self._said(text))
            self._buf = self._buf[len(text):]
            return out

    def _said(self, text: str) -> str:
        tail = text.rstrip(" \t")
        self._line_start = tail.endswith("\n") or (self._line_start and not tail)
        return text

    def flush(self) -> list[Delta]:
        """The stream ended: an unclosed call is parsed as it stands (a model may stop at its
        end-of-turn token instead of the closing tag); held-back text is text after all."""
        rest, self._buf = self._buf, ""
        tagged, self._inside = self._inside, False
        if not rest.strip():
            return []
        if tagged:
            return [parse_call(rest)]
        if self._line_start and rest.lstrip().startswith("{"):
            call = parse_call(rest)
            return [call] if call.name or _names_a_call(rest) else [rest]
        return [rest]


def template_messages(messages: list[Message]) -> list[dict]:
    """Messages as Jinja chat templates read them: a call's arguments as an object (Qwen2.5's template
    writes them with `tojson`, which would quote a JSON string a second time)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [
                {**c, "function": {**c["function"], "arguments": _as_object(c["function"].get("arguments"))}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def _as_object(arguments) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
