"""The embedded llama.cpp chat model: streams text and stops within one token when cancelled."""
import asyncio
import contextlib
import time

import pytest

from helpers import LONG_STORY, cancel_task_after, read_then_close

pytestmark = pytest.mark.models
SYSTEM = {"role": "system", "content": "Answer in one short English sentence."}


@pytest.fixture(scope="module")
def model():
    from llm import load_chat_model

    return load_chat_model("smollm2-135m")


async def test_streams_an_answer(model):
    pieces = [p async for p in model.stream([SYSTEM, {"role": "user", "content": "What is the capital of France?"}])]
    assert len(pieces) > 1 and "".join(pieces).strip()


async def test_cancel_stops_generation_within_one_token(model):
    assert await read_then_close(model.stream(LONG_STORY, max_tokens=400), 5) == 5
    # after aclose the worker has stopped and released the model: a new request starts at once
    t = time.perf_counter()
    first = None
    async with contextlib.aclosing(model.stream([SYSTEM, {"role": "user", "content": "Say hi."}], max_tokens=5)) as toks:
        async for _ in toks:
            first = time.perf_counter() - t
            break
    assert first is not None
    assert model._lock.acquire(timeout=5)
    model._lock.release()


async def test_task_cancel_reaches_the_worker(model):
    produced = await cancel_task_after(model.stream([{"role": "system", "content": "You write very long stories."},
                                                     {"role": "user", "content": "Tell a long story."}],
                                                    max_tokens=400), 3)
    n = len(produced)
    await asyncio.sleep(0.3)
    assert len(produced) == n  # nothing more arrives after the cancel
    assert model._lock.acquire(timeout=5), "the generation thread kept the model"
    model._lock.release()


async def test_warm_evaluates_the_prefix_the_next_prompt_starts_with(model):
    # after a history cut the session warms the new prefix; llama.cpp then reuses every warmed
    # token but the generation header and the one token generated
    prefix = [SYSTEM, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    model.warm(prefix)
    warmed = list(model._llm._input_ids)
    assert len(warmed) > 20
    async for _ in model.stream([*prefix, {"role": "user", "content": "And a fruit?"}], max_tokens=4):
        pass
    after = list(model._llm._input_ids)
    shared = next((i for i, (a, b) in enumerate(zip(warmed, after)) if a != b), min(len(warmed), len(after)))
    assert shared >= len(warmed) - 5, (shared, len(warmed))
    # a different system prompt shares almost nothing: the check can fail
    model.warm([{"role": "system", "content": "Zebra."}, *prefix[1:]])
    other = list(model._llm._input_ids)
    assert next(i for i, (a, b) in enumerate(zip(other, after)) if a != b) < len(warmed) // 2


async def test_warm_on_a_partial_transcript_is_reused_up_to_the_words_so_far(model):
    # while the user speaks the session warms the prompt with their words so far; the final
    # prompt then evaluates only what follows them (llama.cpp keeps the longest common prefix)
    final = [SYSTEM, {"role": "user", "content": "Can you tell me a joke about cats?"}]
    llm = model._llm
    evaluated: list[int] = []
    plain_eval = llm.eval

    def counting_eval(tokens):
        evaluated.append(len(tokens))
        return plain_eval(tokens)

    async def prompt_tokens_evaluated_after(warm_with) -> int:
        model.warm(warm_with)
        evaluated.clear()
        llm.eval = counting_eval
        try:
            async for _ in model.stream(final, max_tokens=1):
                pass
        finally:
            del llm.eval
        return evaluated[0]  # the prompt's batch; later calls are generated tokens

    cold = await prompt_tokens_evaluated_after([SYSTEM])
    warm = await prompt_tokens_evaluated_after([SYSTEM, {"role": "user", "content": "Can you tell me"}])
    words = len(llm.tokenize(b"Can you tell me", add_bos=False))
    assert cold - warm >= words, (cold, warm, words)  # the user header and the words so far


async def test_a_read_ahead_of_a_long_prompt_evaluates_only_what_the_cache_lacks(model):
    # a conversation's prompt outgrows one read-ahead piece within a few turns; each turn's
    # read-ahead (the user's words so far) must evaluate only the new words, not cut the cache
    # back to its first piece and read the rest of the prompt again
    from llm.llamacpp import WARM_PIECE

    llm = model._llm
    history = [SYSTEM]
    for i in range(6):
        history += [{"role": "user", "content": f"Tell me fact number {i} about owls, please."},
                     {"role": "assistant", "content": f"Owls can turn their heads a long way, fact {i}."}]
    assert len(model._prompt_tokens(history, None)) > 2 * WARM_PIECE
    model.warm(history)
    evaluated: list[int] = []
    plain_eval = llm.eval

    def counting_eval(tokens):
        evaluated.append(len(tokens))
        return plain_eval(tokens)

    llm.eval = counting_eval
    try:
        model.warm([*history, {"role": "user", "content": "And what"}])
        model.warm([*history, {"role": "user", "content": "And what do owls eat?"}])
    finally:
        del llm.eval
    new_words = len(llm.tokenize(b"<|im_start|>user\nAnd what do owls eat?<|im_end|>\n<|im_start|>assistant\n",
                                 add_bos=False, special=True))
    # each read-ahead evaluates the user's turn from where its words changed (its end marks twice)
    assert sum(evaluated) <= 2 * new_words, (evaluated, new_words)


async def test_a_reply_does_not_copy_an_earlier_reply(model):
    # asked the same thing again, a small model greedy says its earlier answer word for word;
    # with the earlier replies' runs ruled out it answers in other words
    from llm.no_repeat import NGRAM

    question = {"role": "user", "content": "What do owls eat?"}
    temperature, model.temperature = model.temperature, 0.0
    try:
        model.no_repeat = 0
        earlier = "".join([t async for t in model.stream([SYSTEM, question], max_tokens=24)])  # its own answer
        messages = [SYSTEM, question, {"role": "assistant", "content": earlier}, question]
        copied = "".join([t async for t in model.stream(messages, max_tokens=24)])
        model.no_repeat = NGRAM
        fresh = "".join([t async for t in model.stream(messages, max_tokens=24)])
    finally:
        model.temperature = temperature
    def longest_copy(text: str) -> int:
        """The longest run of tokens `text` shares with the earlier answer."""
        from difflib import SequenceMatcher

        a, b = (model._llm.tokenize(t.strip().encode(), add_bos=False) for t in (text, earlier))
        return SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b)).size

    assert longest_copy(copied) >= NGRAM, copied  # the model copies without the rule
    assert longest_copy(fresh) < NGRAM, fresh


def test_read_ahead_pieces_start_after_the_cached_prefix():
    from llm.llamacpp import WARM_PIECE as P, warm_pieces

    assert warm_pieces(0, 150) == [P, 2 * P, 150]
    assert warm_pieces(93, 300) == [93 + P, 93 + 2 * P, 93 + 3 * P, 300]
    assert warm_pieces(290, 300) == [300]
    assert warm_pieces(300, 300) == []  # all of it is cached: nothing to evaluate


async def test_every_llama_call_runs_on_the_one_model_thread(model):
    """llama.cpp's OpenMP keeps a worker team per calling thread; calls from rotating pool
    threads made several teams and slowed every token (see llm/llamacpp.py). Warm-ups from any
    thread and streams must all reach llama.cpp from the same single thread."""
    import threading

    seen: set[str] = set()
    real = model._llm.create_chat_completion

    def spy(*args, **kwargs):
        seen.add(threading.current_thread().name)
        return real(*args, **kwargs)

    model._llm.create_chat_completion = spy
    try:
        await asyncio.gather(*(asyncio.to_thread(model.warm, [SYSTEM]) for _ in range(3)))
        for _ in range(2):
            assert await read_then_close(model.stream([SYSTEM, {"role": "user", "content": "Say hi."}], max_tokens=3), 2) >= 1
    finally:
        del model._llm.create_chat_completion
    assert len(seen) == 1 and next(iter(seen)).startswith("llama"), seen


async def test_a_stopped_read_ahead_ends_mid_decode_and_leaves_the_cache_whole(model):
    """The session stops a read-ahead when the user stops speaking (their words' decode needs
    the cores): llama.cpp aborts the decode it is in, keeps only whole batches, and the next
    request answers as it would have without the read-ahead."""
    from llm.base import ReadAheadStop

    question = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]

    async def answer() -> str:
        return "".join([p async for p in model.stream(question, max_tokens=8)])

    model._llm.reset()
    expected = await answer()
    model.warm([SYSTEM])
    before = model._llm.n_tokens
    llm, stop, aborted = model._llm, ReadAheadStop(), []
    real_eval = llm.eval

    def eval_then_stop(tokens):  # the stop comes while llama.cpp decodes these tokens
        stop.set()
        try:
            return real_eval(tokens)
        except RuntimeError as e:
            aborted.append(str(e))
            raise

    llm.eval = eval_then_stop
    try:
        await asyncio.to_thread(model.warm, [*question[:1], {"role": "user", "content": LONG_STORY[-1]["content"]}], stop)
    finally:
        del llm.eval
    assert aborted, "llama.cpp's decode was not aborted"
    assert llm.n_tokens <= before  # the shared prefix at most: nothing of the aborted batch counts
    assert await answer() == expected  # and the stop does not reach a later generation
    evals: list[int] = []
    llm.eval = lambda tokens: (evals.append(len(tokens)), real_eval(tokens))[1]
    try:
        model.warm([SYSTEM, {"role": "user", "content": "Name a fruit."}], stop)  # stopped before it began
    finally:
        del llm.eval
    assert evals == []


@pytest.mark.parametrize("name,ftype", [("qwen2.5-0.5b-q4_0", "2"), ("qwen2.5-0.5b-iq4_nl", "25")])
async def test_a_requantized_model_is_made_once_from_the_bundled_one_and_answers(name, ftype, tmp_path, monkeypatch):
    from llm import load_chat_model
    from llm.bundled import resolve

    monkeypatch.setenv("DUPLEX_CACHE", str(tmp_path))
    path = resolve(name)
    assert path.parent == tmp_path and path.stat().st_size > 100e6
    made = path.stat().st_mtime_ns
    assert resolve(name) == path and path.stat().st_mtime_ns == made  # not made again
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # no temporary file left
    model = load_chat_model(name)
    assert model._llm.metadata["general.file_type"] == ftype  # llama.cpp's LLAMA_FTYPE_MOSTLY_* number
    answer = "".join([p async for p in model.stream([SYSTEM, {"role": "user", "content": "What is the capital of France?"}])])
    assert "paris" in answer.lower(), answer


async def test_a_stream_closed_early_goes_on_from_its_words(model):
    """What a paused reply does: close the stream after a few words (the model's lock is free),
    then ask again with those words as the prefix; greedy, the answer is the one it would have
    given at once."""
    model.temperature = 0.0
    messages = [{"role": "system", "content": "Answer in one short English sentence."},
                {"role": "user", "content": "What is the capital of France?"}]
    try:
        whole = "".join([p async for p in model.stream(messages, 40)])
        first = []
        async with contextlib.aclosing(model.stream(messages, 40)) as toks:
            async for p in toks:
                first.append(p)
                if len(first) == 3:
                    break
        assert not model._lock.locked(), "a closed stream holds no lock"
        said = "".join(first)
        rest = "".join([p async for p in model.stream(messages, 40, prefix=said)])
    finally:
        model.temperature = 0.2
    assert model.continues_text and rest.strip()
    assert said + rest == whole, (said, rest, whole)


async def test_no_sampler_outlives_its_call(model):
    """llama-cpp-python's sampler holds itself (a reference cycle) and the next call's replaces
    it; ended calls must leave none for the cyclic collector, which a serving process leaves alone."""
    import gc

    from llama_cpp._internals import LlamaSampler

    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there, how are you?"},
                {"role": "user", "content": "Again."}]
    gc.collect()
    gc.disable()
    try:
        for i in range(3):
            async for _ in model.stream(messages, max_tokens=4):
                pass
            await asyncio.to_thread(model.warm, messages + [{"role": "user", "content": f"and {i}"}])
        assert sum(type(o) is LlamaSampler for o in gc.get_objects()) == 0
    finally:
        gc.enable()
