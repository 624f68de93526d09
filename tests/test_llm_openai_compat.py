"""The OpenAI-compatible LLM client against a real peer: llama.cpp's own OpenAI-compatible server
(`python -m llama_cpp.server`, from llama-cpp-python[server]) serving the bundled SmolLM2 GGUF."""
import contextlib
import json
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from helpers import LONG_STORY, free_port, read_then_close, say, silence
from llm.openai_compat import LLMError, OpenAICompatChat

pytestmark = pytest.mark.models
SYSTEM = {"role": "system", "content": "Answer in one short English sentence."}


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from llm.bundled import smollm2_135m

    port = free_port()
    log = open(tmp_path_factory.mktemp("llama_server") / "server.log", "w+b")  # a pipe would fill and stall it
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_135m()),
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--verbose", "False"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/models", timeout=2) as r:
                if r.status == 200:
                    break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.seek(0)
            pytest.fail("llama_cpp.server did not start: " + log.read().decode(errors="replace")[-2000:])
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(30)
    log.close()


async def test_streams_an_answer_and_finds_the_model_name(server_url):
    llm = OpenAICompatChat(server_url)
    pieces = [p async for p in llm.stream([SYSTEM, {"role": "user", "content": "What is the capital of France?"}])]
    assert len(pieces) > 1 and "".join(pieces).strip()
    assert llm.model and llm.model in llm.name  # taken from the server's /v1/models


async def test_closing_early_leaves_the_server_serving(server_url):
    llm = OpenAICompatChat(server_url)
    assert await read_then_close(llm.stream(LONG_STORY, max_tokens=400), 3) == 3
    again = [p async for p in llm.stream([SYSTEM, {"role": "user", "content": "Say hello."}], max_tokens=8)]
    assert "".join(again).strip()


async def test_unreachable_server_is_a_clear_error():
    llm = OpenAICompatChat(f"http://127.0.0.1:{free_port()}/v1", model="any")
    with pytest.raises(LLMError, match="cannot reach the LLM server"):
        [p async for p in llm.stream([SYSTEM, {"role": "user", "content": "hi"}])]


async def test_refused_request_is_a_clear_error(server_url):
    llm = OpenAICompatChat(server_url)
    with pytest.raises(LLMError, match=r"(?s)answered HTTP [45]\d\d: .*wizard"):
        [p async for p in llm.stream([{"role": "wizard", "content": "hi"}])]


def test_duplex_run_answers_through_the_server_and_survives_it_gone(server_url, tmp_path):
    wav = tmp_path / "q.wav"
    x = say("What is the capital of France?", tmp_path / "q.raw.wav")
    sf.write(wav, np.concatenate([silence(0.4), x, silence(0.3)]), 16000, subtype="PCM_16")

    def run(llm_url: str, name: str) -> tuple[int, list[dict], list[dict]]:
        far = tmp_path / f"{name}.far.jsonl"
        cmd = [sys.executable, "-m", "agent.serving.cli", "run", "--input", str(wav), "--input", str(wav),
               "--output", str(tmp_path / f"{name}.wav"), "--far-end-log", str(far), "--llm", llm_url,
               "--tts", "flite", "--max-tokens", "24", "--reply-timeout", "6"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return proc.returncode, rows, [json.loads(line) for line in far.read_text().splitlines()]

    rc, rows, _ = run(server_url, "up")
    assert rc == 0 and rows[-1]["replied"] == 2, rows
    assert all(r["reply"] for r in rows[:-1])

    # no server there: each turn gets a clear error event, and the session still hears the second turn
    rc, rows, far = run(f"http://127.0.0.1:{free_port()}/v1", "down")
    errors = [e for e in far if e.get("type") == "error"]
    assert rc == 1 and rows[-1]["replied"] == 0 and rows[-1]["turns"] == 2, rows
    assert len(errors) == 2 and all(e["code"] == "reply_failed" and "cannot reach" in e["message"] for e in errors)
    assert [e["state"] for e in far if e.get("type") == "state"][-1] == "listening"
