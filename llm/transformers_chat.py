"""A local transformers causal LM as a streaming, cancellable chat model: `--llm hf:NAME`.

NAME is a hub id (needs internet, or a filled hub cache), a local model directory, a `.gguf`
file (transformers dequantizes it to torch weights; needs `gguf` and `accelerate`), or one of the
bundled GGUF names (`hf:smollm2-135m` runs the bundled SmolLM2 through transformers, the
offline way to use this backend). llama.cpp (`--llm smollm2-135m`) runs the same GGUF several
times faster on a CPU; this backend is for models llama.cpp cannot run, for GPUs
(`device="cuda"`), and for checking a model's answers against its reference implementation.

Generation is our own token loop over the model's KV cache (prefill once, then one token per
forward), on a worker thread of its own, so that a stop flag is checked before every token:
cancelling stops it within one token, as the llama.cpp backend does. The cache of the last
request is kept, and the next prompt reuses its common prefix (the system prompt, the history,
the words of a partial transcript `warm` evaluated while the user was still speaking), as
llama.cpp does. Tokens are decoded
incrementally; a piece that ends inside a multi-byte character waits for the next token.
"""
from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llm.base import Message, ReadAheadStop
from llm.bridge import iterate_in_thread
from llm.tool_format import ToolCallText, template_messages
from llm.tool_results import for_size

PREFIX = "hf:"


def is_transformers(name: str) -> bool:
    return name.startswith(PREFIX)


class TransformersChat:
    def __init__(self, name_or_path: str, device: str = "cpu", temperature: float = 0.2, max_tokens: int = 96,
                 seed: int = 0, name: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llm.bundled import BUNDLED

        source, gguf = name_or_path, None
        if name_or_path in BUNDLED:
            source = str(BUNDLED[name_or_path]())
        if source.endswith(".gguf") and Path(source).is_file():
            source, gguf = str(Path(source).parent), Path(source).name
        self.name = name or f"{PREFIX}{name_or_path}"
        self.max_tokens, self.temperature = max_tokens, temperature
        self.device = torch.device(device)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transformers")
        kwargs = {"gguf_file": gguf} if gguf else {}
        self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        self.model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(self.device).eval()
        config = self.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()  # one model, one generation at a time
        self.tool_results = for_size(self.model.num_parameters())  # llm/tool_results.py
        self.tokens_generated = 0  # forward passes that produced a token (for tests and stats)
        self.last_prefill_tokens = 0  # prompt tokens the last request had to evaluate
        self._kept = None  # the KV cache of the last request: a prompt sharing its prefix reuses it
        self._kept_ids: list[int] = []

    def _reuse(self, prompt: list[int]):
        """The kept cache cropped to its common prefix with `prompt` (at most all of it but the
        last token, whose logits are needed), and the tokens still to feed."""
        keep = 0
        if self._kept is not None and self._kept.is_croppable:
            limit = min(len(self._kept_ids), len(prompt) - 1)
            while keep < limit and self._kept_ids[keep] == prompt[keep]:
                keep += 1
        if keep == 0:
            return None, prompt
        extra = self._kept.get_seq_length() - keep
        if extra > 0:
            self._kept.crop(-extra)  # transformers 5: a negative count removes that many from the end
        self._kept_ids = self._kept_ids[:keep]  # the ids and the cache always say the same tokens
        return self._kept, prompt[keep:]

    def _tokens(self, messages: list[Message], max_tokens: int, stop: threading.Event,
                tools: list[dict] | None = None) -> Iterator[int]:
        import torch

        prompt = self.tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=True,
                                                    return_tensors="pt", return_dict=True,
                                                    **({"tools": tools} if tools else {}))["input_ids"][0].tolist()
        cache, feed = self._reuse(prompt)
        fed = prompt[:len(prompt) - len(feed)]
        self.last_prefill_tokens = len(feed)
        with torch.inference_mode():
            for _ in range(max_tokens):
                if stop.is_set():
                    return
                self._kept = None  # a forward that fails halfway leaves no half-written cache behind
                out = self.model(input_ids=torch.tensor([feed], device=self.device), cache=cache, use_cache=True,
                                 logits_to_keep=1)
                cache, logits = out.cache, out.logits[0, -1].float()
                fed = fed + feed
                self._kept, self._kept_ids = cache, fed
                if self.temperature > 0:
                    probs = torch.softmax(logits / self.temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=self._generator))
                else:
                    token = int(logits.argmax())
                self.tokens_generated += 1
                if token in self.eos_ids:
                    return
                yield token
                feed = [token]

    def _generate(self, messages: list[Message], max_tokens: int, stop: threading.Event,
                  tools: list[dict] | None = None) -> Iterator:
        with self._lock:
            if stop.is_set():
                return
            tokens: list[int] = []
            said = ""
            calls = ToolCallText() if tools else None  # the chat template's tool-call tags
            for token in self._tokens(messages, max_tokens, stop, tools):
                tokens.append(token)
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                if text.endswith("\ufffd"):
                    continue  # inside a multi-byte character: wait for the rest of it
                if len(text) > len(said):
                    piece, said = text[len(said):], text
                    yield from calls.push(piece) if calls else (piece,)
            if calls and not stop.is_set():
                yield from calls.flush()

    def warm(self, messages: list[Message], stop: ReadAheadStop | None = None) -> None:
        """Evaluate the prompt for `messages` now (blocking), so that a request that starts with
        it only evaluates what follows (the session warms the system prompt and partial
        transcripts while the user speaks). A `stop` set before it begins skips it; once begun,
        its one forward runs to the end."""
        self._thread.submit(self._warm, list(messages), stop).result()

    def _warm(self, messages: list[Message], stop: ReadAheadStop | None) -> None:
        with self._lock:
            if stop is not None and stop.is_set():
                return
            for _ in self._tokens(messages, 1, threading.Event()):
                pass

    def stream(self, messages: list[Message], max_tokens: int | None = None,
               tools: list[dict] | None = None) -> AsyncIterator:
        n = max_tokens or self.max_tokens
        return iterate_in_thread(lambda stop: self._generate(messages, n, stop, tools), maxsize=2, on_demand=True,
                                 executor=self._thread)
