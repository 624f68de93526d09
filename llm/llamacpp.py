"""Embedded GGUF chat model on llama-cpp-python, generating in a worker thread of its own.

Every call into llama.cpp (load, warm, generate) runs on one dedicated thread. llama.cpp's CPU
backend parallelises with OpenMP, and libgomp keeps a team of worker threads for each thread
that calls into it. Calls from a thread pool's rotating workers make several teams; once
libgomp manages more threads than there are cores it spins only ~100 rounds between operations
and then sleeps, and every token pays for the wake-ups. On this 2-core machine a token took
~21.5 ms once a second thread had called llama.cpp, against ~16.3 ms with one (a stand-alone
loop, 30 tokens, three runs each). The OpenMP spin itself is set in agent/models.py.
"""
from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from llm.base import Message
from llm.bridge import iterate_in_thread


class LlamaCppChat:
    def __init__(self, model_path: str, n_ctx: int = 2048, n_threads: int | None = None,
                 temperature: float = 0.2, max_tokens: int = 96, seed: int = 0, name: str | None = None):
        from llama_cpp import Llama

        self.name = name or os.path.basename(model_path)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._llm = self._thread.submit(
            Llama, model_path=model_path, n_ctx=n_ctx, n_threads=n_threads or os.cpu_count(),
            seed=seed, verbose=False).result()
        self._lock = threading.Lock()  # one llama context: one generation at a time

    def _generate(self, messages: list[Message], max_tokens: int, stop: threading.Event):
        with self._lock:
            if stop.is_set():
                return
            chunks = self._llm.create_chat_completion(
                messages=list(messages), max_tokens=max_tokens, temperature=self.temperature, stream=True)
            try:
                for chunk in chunks:
                    if stop.is_set():
                        break
                    delta = chunk["choices"][0].get("delta", {}).get("content")
                    if delta:
                        yield delta
            finally:
                chunks.close()

    def warm(self, messages: list[Message]) -> None:
        self._thread.submit(self._warm, list(messages)).result()

    def _warm(self, messages: list[Message]) -> None:
        # llama.cpp reuses the longest common prefix of its evaluated tokens with the next
        # prompt; one generated token is the cheapest way to get the prefix evaluated.
        with self._lock:
            self._llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0.0)

    def stream(self, messages: list[Message], max_tokens: int | None = None) -> AsyncIterator[str]:
        # Return the bridge's generator itself (not a wrapper around it), so that closing the
        # stream closes the bridge at once and the worker thread has stopped when aclose() returns.
        # On demand: a reader that stops reading for a while (the session, while the first audio
        # is synthesized) pauses the model and frees the CPU.
        n = max_tokens or self.max_tokens
        return iterate_in_thread(lambda stop: self._generate(messages, n, stop), maxsize=2, on_demand=True,
                                 executor=self._thread)
