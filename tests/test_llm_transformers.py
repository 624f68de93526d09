"""`--llm hf:NAME`: a transformers causal LM as a chat model, run offline on the bundled SmolLM2
GGUF (transformers dequantizes it). Its token loop is checked against transformers' own
`generate`, and it streams and stops within one token as the llama.cpp backend does."""
import asyncio

import pytest

from helpers import LONG_STORY, cancel_task_after, read_then_close

pytestmark = pytest.mark.models
SYSTEM = {"role": "system", "content": "Answer in one short English sentence."}
QUESTION = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model():
    from llm import load_chat_model

    return load_chat_model("hf:smollm2-135m", temperature=0.0)


def test_greedy_tokens_equal_transformers_generate(model):
    import threading

    import torch

    ids = model.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt",
                                              return_dict=True)
    with torch.inference_mode():
        ref = model.model.generate(**ids, max_new_tokens=24, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
    ref = ref[:ref.index(next(t for t in ref if t in model.eos_ids))] if any(t in model.eos_ids for t in ref) else ref
    ours = list(model._tokens(QUESTION, 24, threading.Event()))
    assert ours == ref and len(ours) > 3, (ours, ref)


async def test_streams_an_answer(model):
    pieces = [p async for p in model.stream(QUESTION)]
    assert len(pieces) > 1 and "paris" in "".join(pieces).lower(), pieces


async def test_cancel_stops_generation_within_one_token(model):
    before = model.tokens_generated
    assert await read_then_close(model.stream(LONG_STORY, max_tokens=300), 5) == 5
    # the worker stops before its next forward pass: at most one token beyond what was read
    # (plus a token that completed no text of its own)
    assert model.tokens_generated - before <= 7, model.tokens_generated - before
    assert model._lock.acquire(timeout=5), "the generation thread kept the model"
    model._lock.release()


async def test_task_cancel_reaches_the_worker(model):
    produced = await cancel_task_after(model.stream(LONG_STORY, max_tokens=300), 3)
    n, generated = len(produced), model.tokens_generated
    await asyncio.sleep(0.3)
    assert len(produced) == n and model.tokens_generated - generated <= 1


def test_a_prompt_reuses_the_cache_of_the_one_before_and_answers_the_same(model):
    import threading

    fresh = list(model._tokens(QUESTION, 12, threading.Event()))  # whatever came before
    model.warm([SYSTEM, {"role": "user", "content": "What is the capital"}])  # a partial transcript
    again = list(model._tokens(QUESTION, 12, threading.Event()))
    full = len(model.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert model.last_prefill_tokens < full // 2, (model.last_prefill_tokens, full)
    assert again == fresh  # the reused cache changes nothing in the answer
    stopped = threading.Event()
    stopped.set()  # a request cancelled between its cache reuse and its first forward ...
    assert list(model._tokens([SYSTEM, {"role": "user", "content": "What is"}], 12, stopped)) == []
    assert list(model._tokens(QUESTION, 12, threading.Event())) == fresh  # ... leaves a cache that still fits
    model._kept = None  # and from nothing at all: the same again
    assert list(model._tokens(QUESTION, 12, threading.Event())) == fresh and model.last_prefill_tokens == full
