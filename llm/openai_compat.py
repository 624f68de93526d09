"""Any OpenAI-compatible chat endpoint (llama.cpp's server, vLLM, Ollama, OpenAI itself), streamed.

`--llm http://127.0.0.1:8000/v1` selects it. The model name comes from `--llm-model` (or
`DUPLEX_LLM_MODEL`); without one, the first model the server lists under `/v1/models` is used,
which is what single-model servers (llama.cpp, vLLM) expect. The key comes from
`OPENAI_API_KEY` when the server needs one.

Generation is network I/O on the event loop (nothing blocks it). Closing the stream closes the
HTTP response, which is how these servers learn to stop generating; no text is buffered beyond
the chunk being read.

Faults: the client never retries (`max_retries=0`): a retry would hide a server that is down
behind seconds of silence, and the reply's own deadline (`llm_timeout_s`, agent/conversation/reply.py) is
what bounds the wait for the first and each next token; `timeout_s` is only the HTTP client's
outer bound. A refused connection, an HTTP error and a connection cut mid-answer (server killed,
proxy gone) each raise `LLMError`. A stream abandoned at any point (closed, or its task
cancelled by that deadline while a request or a read waits) closes its HTTP response, so the
connection is released, never left open to a server that stopped answering.
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator

from llm.base import Message, ToolCall
from llm.tool_format import ToolCallText, new_call_id


class LLMError(RuntimeError):
    """The LLM could not answer: unreachable, refused, or failed mid-answer."""


def is_endpoint(name: str) -> bool:
    return name.startswith(("http://", "https://"))


class OpenAICompatChat:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 temperature: float = 0.2, max_tokens: int = 96, timeout_s: float = 30.0):
        from openai import AsyncOpenAI

        self.base_url = base_url.rstrip("/")
        self.model = model or os.environ.get("DUPLEX_LLM_MODEL") or None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.name = f"{self.model or 'openai-compatible'} @ {self.base_url}"
        self._client = AsyncOpenAI(base_url=self.base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                                   timeout=timeout_s, max_retries=0)

    async def _model_name(self) -> str:
        if self.model is None:
            models = await self._client.models.list()
            ids = [m.id for m in models.data]
            if not ids:
                raise LLMError(f"{self.base_url}/models lists no model; pass --llm-model")
            self.model = ids[0]
            self.name = f"{self.model} @ {self.base_url}"
        return self.model

    async def stream(self, messages: list[Message], max_tokens: int | None = None,
                     tools: list[dict] | None = None) -> AsyncIterator[str | ToolCall]:
        import openai

        limit = max_tokens or self.max_tokens
        try:
            response = await self._client.chat.completions.create(
                model=await self._model_name(), messages=list(messages), stream=True,
                max_tokens=limit, temperature=self.temperature, **({"tools": tools} if tools else {}))
        except openai.APIConnectionError as e:
            raise LLMError(f"cannot reach the LLM server at {self.base_url}: {e}") from e
        except openai.APIStatusError as e:
            raise LLMError(f"the LLM server at {self.base_url} answered HTTP {e.status_code}: {e.message[:500]}") from e
        pieces = 0
        calls = StreamedToolCalls()
        # a server that passes a template's tool-call tags through as text (no tool parser of its own)
        tagged = ToolCallText() if tools else None
        try:
            async for chunk in response:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                calls.push(delta.tool_calls)
                if text := delta.content:
                    pieces += 1
                    for out in tagged.push(text) if tagged else (text,):
                        yield out
                    if pieces > limit:  # a server that ignores max_tokens is not read for ever
                        break
            for out in tagged.flush() if tagged else ():
                yield out
            for call in calls.done():
                yield call
        except openai.APIError as e:
            raise LLMError(f"the LLM stream from {self.base_url} broke off after {pieces} pieces: {e}") from e
        finally:
            await response.close()  # also when cancelled: the connection is not kept


class StreamedToolCalls:
    """OpenAI's streamed `tool_calls` deltas put together: each call arrives in pieces keyed by
    its index (its id and name first, its JSON arguments in fragments after)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict] = {}

    def push(self, deltas) -> None:
        for d in deltas or ():
            index = getattr(d, "index", None) or 0
            call = self._calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
            if getattr(d, "id", None):
                call["id"] = d.id
            if (fn := getattr(d, "function", None)) is not None:
                call["name"] += fn.name or ""
                call["arguments"] += fn.arguments or ""

    def done(self) -> list[ToolCall]:
        return [ToolCall(c["id"] or new_call_id(), c["name"], c["arguments"] or "{}")
                for _, c in sorted(self._calls.items())]
