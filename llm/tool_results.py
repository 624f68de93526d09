"""How a model reads the results of the tools it called: two strategies.

`NATIVE`: the calls and results go to the model as its chat template lays them out, and it may
call again (chains of calls). What capable models and servers expect.

`INLINE`: small models cannot read their template's results. Given a result as a `tool`
message, Qwen2.5-Coder-0.5B answers with another call, even with every token holding "{"
banned (it writes the call in a code block instead); given the same result as a note in the
user's turn, without tools, it answers ("What time is it in Tokyo?" -> "The time in Tokyo is
half past three in the afternoon."). So each result is folded into the turn that asked for it,
and the round after the results offers no tools: one round of calls, then the answer.

The history always keeps calls and results as messages; a strategy only shapes the prompt.
"""
from __future__ import annotations

from llm.base import Message

# models below this many parameters get INLINE by default (llm/llamacpp.py, llm/transformers_chat.py)
SMALL_MODEL_PARAMS = 3e9


class NativeToolResults:
    chains = True  # the model may call again after reading results

    def prepare(self, messages: list[Message], tools_offered: bool = True) -> list[Message]:
        return messages


class InlineToolResults:
    chains = False

    def prepare(self, messages: list[Message], tools_offered: bool = True) -> list[Message]:
        """The prompt for a round: with tools, the conversation before the user's last turn as a
        transcript at the start of that turn (the 0.5B model, shown earlier turns as turns,
        stops calling tools: 0 of 4 weather and time questions after a greeting or two
        exchanges, 4 of 4 with them as a transcript; the system prompt and its tools stay the
        prompt's cached prefix); without tools (the answer), the turns as turns, each call and
        result folded into a note on the turn that asked, and the results for the turn being
        answered in the system prompt (after a greeting, given them as a note on the question it
        answered 'Good day! How can I assist you today?' to the weather; given them in the
        system prompt, 3 of 3 answers read them)."""
        return _as_transcript(messages) if tools_offered else self._fold(messages)

    def _fold(self, messages: list[Message]) -> list[Message]:
        if not any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            return messages
        out: list[dict] = []
        names: dict[str, str] = {}
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        now: list[str] = []  # the results for the turn being answered
        for i, m in enumerate(messages):
            if m["role"] == "assistant" and m.get("tool_calls"):
                names.update({c["id"]: c["function"]["name"] for c in m["tool_calls"]})
                if m.get("content"):
                    _say(out, m["content"])
            elif m["role"] == "tool":
                note = f"{names.get(m.get('tool_call_id', ''), 'a tool')} returned: {m['content']}"
                asked = next((k for k in range(len(out) - 1, -1, -1) if out[k]["role"] == "user"), None)
                if i > last_user:
                    now.append(note)
                elif asked is None:
                    out.insert(0, {"role": "user", "content": f"({note})"})
                else:
                    out[asked] = {**out[asked], "content": f"{out[asked]['content']}\n\n({note})"}
            elif m["role"] == "assistant":
                _say(out, m["content"])
            else:
                out.append(dict(m))
        if now and out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + "\n".join(now)}
        elif now:
            out.insert(0, {"role": "system", "content": "\n".join(now)})
        return out


def _as_transcript(messages: list[Message]) -> list[Message]:
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system):]
    last = max((i for i, m in enumerate(rest) if m["role"] == "user"), default=None)
    earlier, now = (rest, None) if last is None else (rest[:last], rest[last])
    lines, names = [], {}
    for m in earlier:
        if m["role"] == "user":
            lines.append(f"Caller: {m['content']}")
        elif m["role"] == "tool":
            lines.append(f"({names.get(m.get('tool_call_id', ''), 'a tool')} returned: {m['content']})")
        elif m["role"] == "assistant":
            names.update({c["id"]: c["function"]["name"] for c in m.get("tool_calls") or ()})
            if m.get("content"):
                lines.append(f"You: {m['content']}")
    if not lines:
        return messages
    said = "The conversation so far:\n" + "\n".join(lines)
    if now is None:  # a read-ahead of the history alone: the prefix the next turn's prompt starts with
        return [*system, {"role": "user", "content": said}]
    return [*system, {"role": "user", "content": f"{said}\n\nThe caller now says: {now['content']}"},
            *rest[last + 1:]]


def _say(out: list[dict], text: str) -> None:
    if out and out[-1]["role"] == "assistant":
        out[-1] = {**out[-1], "content": f"{out[-1]['content']} {text}".strip()}
    else:
        out.append({"role": "assistant", "content": text})


NATIVE = NativeToolResults()
INLINE = InlineToolResults()


def for_size(n_params: float | None):
    """The default for a model of `n_params` parameters (unknown: NATIVE)."""
    return INLINE if n_params is not None and n_params < SMALL_MODEL_PARAMS else NATIVE


def style_for(chosen, llm):
    """The strategy `chosen` (a ToolPolicy's), else the model's own, else NATIVE."""
    return chosen or getattr(llm, "tool_results", None) or NATIVE
