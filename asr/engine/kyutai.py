"""Kyutai STT (delayed streams) for the batched engine: loading weights and turning tokens into words.

Weights come from transformers' `KyutaiSpeechToTextForConditionalGeneration` (the LM and its
Mimi codec), so anything transformers can load works here:
- `kyutai/stt-1b-en_fr-trfs`, `kyutai/stt-2.6b-en-trfs` (hub ids, need internet) or a local
  directory holding such a checkpoint; the bare ids `kyutai/stt-1b-en_fr` / `kyutai/stt-2.6b-en`
  (moshi-format repos) are mapped to their `-trfs` twins;
- `tiny_random(seed)`: a tiny seeded random model for tests and CPU benchmarks. Its output is
  noise, not speech recognition. `python -m asr.engine.kyutai --save-tiny DIR` writes the same model as
  a transformers checkpoint (config, weights, processor with a generated tokenizer), so that it
  goes through exactly the `from_pretrained` path a hub id takes, offline.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from asr.engine.engine import KyutaiLM, LMConfig, StreamingEngine
from asr.engine.mimi import MimiSpec, MimiStreamingEncoder
from asr.moshi_protocol import SAMPLE_RATE  # the model's rate, which the protocol carries

FRAME_RATE = 12.5
WORD_BOUNDARY_TOKEN = 0  # Kyutai STT emits text token 0 where a new word starts
TEXT_PAD_TOKEN = 3  # and token 3 as padding between words

_TRFS_ALIASES = {
    "kyutai/stt-1b-en_fr": "kyutai/stt-1b-en_fr-trfs",
    "kyutai/stt-2.6b-en": "kyutai/stt-2.6b-en-trfs",
}
# Known ASR delays (in 80 ms frames) when the checkpoint's feature extractor does not say.
_DEFAULT_DELAY = {"kyutai/stt-1b-en_fr-trfs": 6, "kyutai/stt-2.6b-en-trfs": 31}
TINY_DELAY_FRAMES = 2  # the ASR delay the tiny random model is run with
# Config attribute that marks a checkpoint written by `save_tiny`, so loading it says "random".
TINY_SEED_KEY = "duplex_tiny_random_seed"


@dataclass
class LoadedModel:
    """An engine plus what the scheduler needs to turn its tokens into words."""

    engine: StreamingEngine
    asr_delay_frames: int
    decode: Callable[[list[int]], str]
    name: str
    is_random: bool = False
    hf_model: object | None = field(default=None, repr=False)  # kept only when asked (tests)


def tiny_hf_model(seed: int = 0, window: int = 8, layers: int = 2, codebooks: int = 4,
                  hidden: int = 32, mimi_window: int = 6):
    """A tiny seeded random transformers model (LM + Mimi) with non-degenerate codebooks."""
    from transformers import KyutaiSpeechToTextConfig, KyutaiSpeechToTextForConditionalGeneration, MimiConfig

    torch.manual_seed(seed)
    mimi = MimiConfig(hidden_size=16, num_filters=4, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=32, codebook_size=16, codebook_dim=8,
                      vector_quantization_hidden_dimension=8, num_quantizers=codebooks,
                      sliding_window=mimi_window, upsample_groups=16)
    vocab = 48
    cfg = KyutaiSpeechToTextConfig(
        codec_config=mimi.to_dict(), vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, ffn_dim=2 * hidden, num_codebooks=codebooks,
        codebook_vocab_size=17, audio_bos_token_id=16, audio_pad_token_id=vocab + codebooks * 17,
        bos_token_id=vocab - 1, pad_token_id=TEXT_PAD_TOKEN, max_position_embeddings=window,
        sliding_window=window)
    model = KyutaiSpeechToTextForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if "embed_sum" in name:  # transformers initialises codebooks to zeros: all codes tie
                t.copy_(torch.randn(t.shape, generator=g))
            elif "layer_scale" in name:  # default 0.01 would make the codec transformer invisible
                t.copy_(1.0 + torch.rand(t.shape, generator=g))
            elif "encoder_transformer" in name and name.endswith("proj.weight"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.5)
            elif name.startswith("model.") or name.startswith("lm_head"):
                if t.dtype.is_floating_point and "norm" not in name:
                    t.copy_(torch.randn(t.shape, generator=g) * 0.2)  # larger than init: varied tokens
        for m in model.modules():
            if hasattr(m, "_embed"):
                m._embed = None
    return model


def engine_from_hf(model, batch_size: int, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32, window: int | None = None,
                   compile: bool = False, tune_convs: bool = False) -> StreamingEngine:
    """Build our engine from a transformers Kyutai STT model (weights copied, model untouched)."""
    cfg = model.config
    lm = KyutaiLM(LMConfig.from_hf(cfg, window=window))
    sd = model.state_dict()
    lm.load_hf_state_dict(sd)
    mimi = MimiStreamingEncoder(MimiSpec.from_hf(model.codec_model.config), batch_size,
                                num_codebooks=cfg.num_codebooks)
    prefix = "codec_model."
    mimi.load_hf_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    return StreamingEngine(lm.to(device), mimi.to(device), batch_size, dtype=dtype, compile=compile,
                           tune_convs=tune_convs)


def _tiny_token(i: int) -> str:
    return f"<{i}>"  # the tiny model's "text": its token ids, visibly not words


def _random_label(seed: int) -> str:
    return f"tiny-random(seed={seed}) - NOT A SPEECH MODEL"


def tiny_random(batch_size: int, seed: int = 0, device: str = "cpu", keep_hf: bool = False,
                compile: bool = False, tune_convs: bool = False, **shape) -> LoadedModel:
    """Tiny random model, labelled as such: for tests and CPU benchmarks only."""
    model = tiny_hf_model(seed, **shape)
    engine = engine_from_hf(model, batch_size, device=device, compile=compile, tune_convs=tune_convs)
    return LoadedModel(engine=engine, asr_delay_frames=TINY_DELAY_FRAMES,
                       decode=lambda ids: "".join(_tiny_token(i) for i in ids),
                       name=_random_label(seed), is_random=True, hf_model=model if keep_hf else None)


def tiny_processor(vocab_size: int):
    """A Kyutai STT processor for the tiny model, made here (no download): a word-level tokenizer
    whose token i is `<i>`, fused without spaces on decode, so `decode` gives what
    `tiny_random`'s does; the feature extractor carries the tiny model's ASR delay."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import (KyutaiSpeechToTextFeatureExtractor, KyutaiSpeechToTextProcessor,
                              PreTrainedTokenizerFast)

    tok = Tokenizer(models.WordLevel({_tiny_token(i): i for i in range(vocab_size)}, unk_token=_tiny_token(1)))
    tok.decoder = decoders.Fuse()
    features = KyutaiSpeechToTextFeatureExtractor(sampling_rate=SAMPLE_RATE,
                                                  audio_delay_seconds=TINY_DELAY_FRAMES / FRAME_RATE)
    return KyutaiSpeechToTextProcessor(features, PreTrainedTokenizerFast(tokenizer_object=tok))


def emit_words_often(model) -> None:
    """Swap two pairs of the tiny model's output rows (tokens 0<->34, 3<->13) so that it often
    emits the word-boundary and pad tokens: its random "text" then comes as words, about ten per
    4 s of audio (seed 0), which plumbing tests need (the plain random model almost never does)."""
    with torch.no_grad():
        w = model.lm_head.weight
        w[[WORD_BOUNDARY_TOKEN, 34]] = w[[34, WORD_BOUNDARY_TOKEN]]
        w[[TEXT_PAD_TOKEN, 13]] = w[[13, TEXT_PAD_TOKEN]]


def save_tiny(directory: str | os.PathLike, seed: int = 0, words: bool = False, **shape) -> str:
    """Write `tiny_random(seed, **shape)`'s model as a transformers checkpoint (`save_pretrained`:
    config, safetensors weights, processor); `from_pretrained(directory, ...)` loads it offline.
    `words`: the variant that emits words often (`emit_words_often`)."""
    model = tiny_hf_model(seed, **shape)
    if words:
        emit_words_often(model)
    setattr(model.config, TINY_SEED_KEY, seed)
    model.save_pretrained(directory)
    tiny_processor(model.config.vocab_size).save_pretrained(directory)
    return str(directory)


def from_pretrained(name_or_dir: str, batch_size: int, device: str = "cuda",
                    dtype: torch.dtype = torch.bfloat16, window: int | None = None,
                    asr_delay_frames: int | None = None, compile: bool = False,
                    tune_convs: bool = False) -> LoadedModel:
    """Load a real Kyutai STT checkpoint (hub id needs internet; a local directory does not)."""
    from transformers import AutoProcessor, KyutaiSpeechToTextForConditionalGeneration

    name = _TRFS_ALIASES.get(name_or_dir, name_or_dir)
    model = KyutaiSpeechToTextForConditionalGeneration.from_pretrained(name, dtype=torch.float32)
    engine = engine_from_hf(model, batch_size, device=device, dtype=dtype, window=window, compile=compile,
                            tune_convs=tune_convs)
    processor = AutoProcessor.from_pretrained(name)
    if asr_delay_frames is None:
        seconds = getattr(processor.feature_extractor, "audio_delay_seconds", None)
        asr_delay_frames = int(seconds * FRAME_RATE) if seconds else _DEFAULT_DELAY.get(name, 6)
    tokenizer = processor.tokenizer

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    seed = getattr(model.config, TINY_SEED_KEY, None)  # written by save_tiny: random weights
    del model
    label = os.path.basename(name.rstrip("/"))
    return LoadedModel(engine=engine, asr_delay_frames=asr_delay_frames, decode=decode,
                       name=label if seed is None else f"{label}: {_random_label(seed)}", is_random=seed is not None)


@dataclass(frozen=True)
class WordStart:
    text: str
    start_time: float


@dataclass(frozen=True)
class WordEnd:
    stop_time: float


class WordAssembler:
    """Per-stream detokeniser with the ASR delay, following moshi-server's word timing.

    Feed the greedy token of every LM position p (p = audio frames seen, the BOS step is p=0).
    Tokens before the delay are ignored. Token 0 or 3 closes the word being built (a `WordStart`
    with its start time), token 0 also marks a stop time `(p + 1 - delay) / 12.5` s, sent as
    `WordEnd` for the word it closes.
    """

    def __init__(self, delay_frames: int, decode: Callable[[list[int]], str], frame_rate: float = FRAME_RATE):
        self.delay, self.decode, self.frame_rate = delay_frames, decode, frame_rate
        self._tokens: list[int] = []
        self._last_stop = 0.0
        self._unended = False

    def push(self, token: int, p: int) -> list[WordStart | WordEnd]:
        step_idx = p + 1  # LM steps done, as moshi counts them
        if step_idx < self.delay:
            return []
        out: list[WordStart | WordEnd] = []
        if token in (WORD_BOUNDARY_TOKEN, TEXT_PAD_TOKEN):
            if self._tokens:
                out.append(WordStart(self.decode(self._tokens), self._last_stop))
                self._tokens = []
                self._unended = True
        else:
            self._tokens.append(int(token))
        if token == WORD_BOUNDARY_TOKEN:
            stop = (step_idx - self.delay) / self.frame_rate
            if self._unended:
                out.append(WordEnd(stop))
                self._unended = False
            self._last_stop = stop
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asr.engine.kyutai", description="Kyutai STT checkpoint tools.")
    p.add_argument("--save-tiny", metavar="DIR", required=True,
                   help="write the tiny RANDOM Kyutai STT model (not a speech model) as a transformers "
                        "checkpoint in DIR; `duplex asr-serve --model DIR` serves it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--words", action="store_true",
                   help="the variant that emits its random tokens as words often (for plumbing tests)")
    args = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    print(f"wrote {save_tiny(args.save_tiny, seed=args.seed, words=args.words)}: {_random_label(args.seed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
