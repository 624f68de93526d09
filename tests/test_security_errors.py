"""Errors sent to callers say what happened, not where (issue 40): an LLM server's URL and a
recognizer replica's address stay in the server log; the page gets the code and a plain
sentence. A real page conversation over loopback against `duplex serve`'s Server, with an LLM
double that fails the way an unreachable LLM server does."""
from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from agent.serving.public_errors import public
from doubles import ScriptedLLM
from helpers import page_conversation
from test_serving import RATE, doubles, question, serving

pytestmark = pytest.mark.usefixtures("virtual_clock")

WHERE = "http://10.9.8.7:8000/v1"


class UnreachableLLM(ScriptedLLM):
    async def stream(self, messages, max_tokens=None, **kwargs):
        raise RuntimeError(f"cannot reach the LLM server at {WHERE}: connection refused")
        yield  # an async generator, as a model's stream is


def test_addresses_and_urls_are_replaced_by_the_codes_sentence():
    assert public("reply_failed", f"cannot reach the LLM server at {WHERE}: refused") == \
        "the reply could not be made; please say that again"
    assert "10.1.2.3" not in public("recognizer_lost", "replica 10.1.2.3:8080 closed the stream")
    assert "asr-2" not in public("no_recognizer", "no recognizer server: ws://asr-2.duplex-asr:8080 refused")
    assert "[fd00::1]" not in public("internal", "lost [fd00::1]")
    for plain in ("audio frame of 60000 bytes exceeds 48000; send 20 ms frames", "no one spoke for 60 s",
                  "the server is shutting down"):
        assert public("whatever", plain) == plain


async def test_a_failed_reply_tells_the_page_what_not_where(caplog):
    caplog.set_level(logging.INFO)
    models = dataclasses.replace(doubles(), llm=UnreachableLLM())
    async with serving(models=models) as s:
        log = await page_conversation(s.url("/ws"), question(), RATE)
    failed = [e for e in log if e["type"] == "error" and e["code"] == "reply_failed"]
    assert failed, [e["type"] for e in log]
    assert WHERE not in json.dumps(log) and "10.9.8.7" not in json.dumps(log)
    assert any("10.9.8.7" in r.getMessage() for r in caplog.records)  # the operator still sees it
