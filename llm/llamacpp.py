"""Embedded GGUF chat model on llama-cpp-python, generating in a worker thread of its own.

Every call into llama.cpp (load, warm, generate) runs on one dedicated thread. llama.cpp's CPU
backend parallelises with OpenMP, and libgomp keeps a team of worker threads for each thread
that calls into it. Calls from a thread pool's rotating workers make several teams; once
libgomp manages more threads than there are cores it spins only ~100 rounds between operations
and then sleeps, and every token pays for the wake-ups: on 2 cores a token costs about a third
more once a second thread has called llama.cpp (a stand-alone loop of 30 tokens re-measures it).
The OpenMP spin itself is set by `agent.conversation.models.configure_openmp`.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from llm.base import Message, ReadAheadStop
from llm.bridge import iterate_in_thread
from llm.no_repeat import NGRAM, NoRepeat, earlier_replies
from llm.tool_format import ToolCallText, template_messages
from llm.tool_results import for_size

log = logging.getLogger("duplex.llm")


@contextlib.contextmanager
def _safe_buffers():
    """llama.cpp's AMX kernels (in a build made with -march=native on an Intel CPU with AMX)
    crash on the first token with our Q4_K/Q8_0 models (llama.cpp #20824).
    scripts/setup.sh builds without them; for a build that has them, the model loads without
    llama.cpp's extra buffer types (AMX's, and the CPU weight repacking), the only switch that
    keeps the AMX kernels out. llama-cpp-python's `Llama` takes no such option, so its model
    defaults are wrapped while it loads (on our one llama thread)."""
    import llama_cpp.llama_cpp as lib

    if b"AMX_INT8 = 1" not in lib.llama_print_system_info():
        yield
        return
    log.warning("llama.cpp was built with its AMX kernels, which crash on this CPU: loading without them "
                "(slower; scripts/setup.sh builds llama-cpp-python without AMX)")
    defaults = lib.llama_model_default_params

    def without_extra_buffers():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffers
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


def load_llama(model_path: str, **kwargs):
    """A `llama_cpp.Llama` (quiet), safe from the AMX kernels; every GGUF we load comes through here."""
    from llama_cpp import Llama

    with _safe_buffers():
        return Llama(model_path=str(model_path), verbose=False, **kwargs)


_strlen = None
_log_filter = None
_ABORT_CLEANUP = b"removing memory module entries"  # what llama.cpp logs after an aborted decode


def _stop_check():
    """llama.cpp's abort callback (`bool (*)(void *)`), as a C function that reads a
    `ReadAheadStop`'s byte: libc's strlen of its buffer is 0 (b"") or 1 (b"x"). A ctypes
    callback in Python would take the GIL at every one of a decode's ~700 graph operations."""
    global _strlen, _log_filter
    if _strlen is None:
        import llama_cpp
        import llama_cpp._logger as logger
        import llama_cpp.llama_cpp as lib

        libc = ctypes.CDLL(None)
        _strlen = lib.ggml_abort_callback(ctypes.cast(libc.strlen, ctypes.c_void_p).value)
        # llama.cpp logs the cache entries it drops after an abort as an error; for a stopped
        # read-ahead that is the plan. Everything else goes to llama-cpp-python's own logger.
        inner = logger.llama_log_callback

        @llama_cpp.llama_log_callback
        def _log_filter(level, text, data):
            if _ABORT_CLEANUP not in text:
                inner(level, text, data)

        llama_cpp.llama_log_set(_log_filter, ctypes.c_void_p(0))
    return _strlen


@contextlib.contextmanager
def stoppable(llama, stop: ReadAheadStop | None):
    """Evaluate with `llama` (a `llama_cpp.Llama`, on its own thread) until `stop` is set:
    llama.cpp then aborts the decode within a graph operation (a few ms) and drops that
    batch's cache entries; the tokens evaluated before it stay (`Llama.eval` counts only whole
    batches). The abort is not an error here. Without `stop`, a plain evaluation."""
    if stop is None:
        yield
        return
    import llama_cpp.llama_cpp as lib

    ctx = llama._ctx.ctx
    lib.llama_set_abort_callback(ctx, _stop_check(), ctypes.cast(stop.buffer, ctypes.c_void_p))
    try:
        yield
    except RuntimeError:
        if not stop.is_set():
            raise  # a failure of llama.cpp's own, not our stop
    finally:
        lib.llama_set_abort_callback(ctx, lib.ggml_abort_callback(0), None)


def release_sampler(llama) -> None:
    """Free the sampler of the call that just ended. llama-cpp-python keeps each call's sampler
    until the next call replaces it, and a sampler holds itself through its exit stack's callback,
    a reference cycle: only the cyclic collector would free it (and the native sampler, and the
    logits processor it holds). Closing it frees them now and breaks the cycle."""
    sampler = getattr(llama, "_sampler", None)
    if sampler is not None:
        llama._sampler = None
        sampler.close()


class LlamaCppChat:
    def __init__(self, model_path: str, n_ctx: int = 2048, n_threads: int | None = None,
                 temperature: float = 0.2, max_tokens: int = 96, seed: int = 0, name: str | None = None,
                 no_repeat: int = NGRAM):
        self.name = name or os.path.basename(model_path)
        self.no_repeat = no_repeat  # tokens in a row a reply may not copy from an earlier one (0: off)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._llm = self._thread.submit(load_llama, model_path, n_ctx=n_ctx, n_threads=n_threads or os.cpu_count(),
                                        seed=seed).result()
        self._lock = threading.Lock()  # one llama context: one generation at a time
        import llama_cpp

        # how it reads its tools' results (llm/tool_results.py): small models only as notes
        self.tool_results = for_size(llama_cpp.llama_model_n_params(self._llm.model))
        self._formatter = _template_formatter(self._llm)

    def _generate(self, messages: list[Message], max_tokens: int, stop: threading.Event, tools: list[dict] | None,
                  prefix: str = ""):
        with self._lock:
            if stop.is_set():
                return
            sampling = {"temperature": self.temperature, "logits_processor": self._no_repeat(messages, itself=not tools)}
            if prefix:  # the answer so far, to go on from: the templated prompt, then its words
                form = self._formatter(messages=template_messages(messages), **({"tools": tools} if tools else {}))
                chunks = self._llm.create_completion(
                    prompt=form.prompt + prefix, max_tokens=max_tokens, stream=True,
                    stop=form.stop, stopping_criteria=form.stopping_criteria, **sampling)
                text = lambda chunk: chunk["choices"][0].get("text")  # noqa: E731
            else:  # the GGUF's own chat template lays out the tools and asks for its tool-call format
                chunks = self._llm.create_chat_completion(
                    messages=template_messages(messages), max_tokens=max_tokens, stream=True,
                    **({"tools": tools} if tools else {}), **sampling)
                text = lambda chunk: chunk["choices"][0].get("delta", {}).get("content")  # noqa: E731
            calls = ToolCallText() if tools else None
            try:
                for chunk in chunks:
                    if stop.is_set():
                        break
                    if delta := text(chunk):
                        yield from calls.push(delta) if calls else (delta,)
                else:
                    if calls:
                        yield from calls.flush()
            finally:
                chunks.close()
                release_sampler(self._llm)

    def _no_repeat(self, messages: list[Message], itself: bool):
        """A logits processor that keeps the reply from copying an earlier one or (`itself`)
        itself (llm/no_repeat.py): not where tools are offered, since two calls in one reply
        repeat the calls' form."""
        if not self.no_repeat:
            return None
        import llama_cpp

        tokenized = [self._llm.tokenize(text.encode("utf-8"), add_bos=False) for text in earlier_replies(messages)]
        return llama_cpp.LogitsProcessorList([NoRepeat(tokenized, self.no_repeat, itself).logits_processor()])

    def warm(self, messages: list[Message], stop: ReadAheadStop | None = None, tools: list[dict] | None = None) -> None:
        self._thread.submit(self._warm, list(messages), stop, tools).result()

    def _warm(self, messages: list[Message], stop: ReadAheadStop | None, tools: list[dict] | None) -> None:
        # llama.cpp reuses the longest common prefix of its evaluated tokens with the next
        # prompt; one generated token is the cheapest way to get the prefix evaluated. A long
        # prompt (the tools' descriptions: ~300 tokens) goes in pieces, so that a stop keeps
        # the pieces done instead of dropping one whole batch (a read-ahead is stopped as soon
        # as the user stops speaking, often a second or two into it).
        with self._lock:
            if stop is not None and stop.is_set():
                return
            tokens = self._prompt_tokens(messages, tools)
            with stoppable(self._llm, stop):
                if tokens is None:
                    try:
                        self._llm.create_chat_completion(messages=template_messages(messages), max_tokens=1,
                                                         temperature=0.0, **({"tools": tools} if tools else {}))
                    finally:
                        release_sampler(self._llm)
                    return
                for end in warm_pieces(self._cached_prefix(tokens), len(tokens)):
                    if stop is not None and stop.is_set():
                        return
                    steps = self._llm.generate(tokens[:end], temp=0.0)
                    try:
                        next(steps)
                    finally:
                        steps.close()
                        release_sampler(self._llm)

    def _cached_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` llama.cpp holds evaluated already (its cache's common prefix)."""
        return self._llm.longest_token_prefix(self._llm._input_ids[:self._llm.n_tokens], tokens)

    def _prompt_tokens(self, messages: list[Message], tools: list[dict] | None) -> list[int] | None:
        """The prompt's tokens exactly as create_chat_completion makes them with the GGUF's own
        template (None for a model whose format llama-cpp-python picks by name)."""
        if self._formatter is None:
            return None
        prompt = self._formatter(messages=template_messages(messages), **({"tools": tools} if tools else {})).prompt
        return self._llm.tokenize(prompt.encode("utf-8"), special=True)

    @property
    def continues_text(self) -> bool:
        """`stream(..., prefix=...)` goes on from an answer's first words (see agent/conversation/reply.py: a
        paused reply closes its stream, so that its lock serves the other conversations)."""
        return self._formatter is not None

    def stream(self, messages: list[Message], max_tokens: int | None = None,
               tools: list[dict] | None = None, prefix: str = "") -> AsyncIterator[str]:
        # Return the bridge's generator itself (not a wrapper around it), so that closing the
        # stream closes the bridge at once and the worker thread has stopped when aclose() returns.
        # On demand: a reader that stops reading for a while (the session, while the first audio
        # is synthesized) pauses the model and frees the CPU.
        n = max_tokens or self.max_tokens
        return iterate_in_thread(lambda stop: self._generate(messages, n, stop, tools, prefix), maxsize=2,
                                 on_demand=True, executor=self._thread)


WARM_PIECE = 64  # tokens a read-ahead evaluates at a time


def warm_pieces(cached: int, total: int) -> list[int]:
    """The prompt lengths a read-ahead evaluates in turn: a piece at a time after the `cached`
    tokens llama.cpp holds already. A piece that ends inside the cached prefix would cut the
    cache back to its end (llama.cpp keeps only the prompt it was last given), so that every
    turn would read the prompt again from there."""
    return [*range(cached + WARM_PIECE, total, WARM_PIECE), total] if cached < total else []


def _template_formatter(llm):
    """The GGUF's chat template as llama-cpp-python renders it for create_chat_completion
    ("chat_template.default"), or None when it uses a format of its own."""
    if llm.chat_format != "chat_template.default" or "tokenizer.chat_template" not in llm.metadata:
        return None
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    def text(token: int) -> str:
        return llm._model.token_get_text(token) if token != -1 else ""

    return Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token=text(llm.token_eos()),
                               bos_token=text(llm.token_bos()), stop_token_ids=[llm.token_eos()])

