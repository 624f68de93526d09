"""Speech recognition: one push-based streaming interface (asr.base) and the recognizers behind it:
the embedded Whisper default, the batched Kyutai engine in this process, and a remote client of
the Kyutai protocol."""
from __future__ import annotations

import json
import os

from asr.base import (
    Flushed,
    Gap,
    Hypothesis,
    Partial,
    PauseProbability,
    RecognizerEvent,
    RecognizerFailed,
    RecognizerStream,
    RecognizerUnavailable,
    StreamingRecognizer,
    Word,
    WordEvent,
)

__all__ = [
    "Flushed", "Gap", "Hypothesis", "Partial", "PauseProbability", "RecognizerEvent", "RecognizerFailed",
    "RecognizerStream", "RecognizerUnavailable", "StreamingRecognizer", "Word", "WordEvent", "load_recognizer",
    "recognizer_kind",
]

KYUTAI_MODEL_TYPE = "kyutai_speech_to_text"  # config.json of a transformers Kyutai STT checkpoint
_engines: dict[tuple, StreamingRecognizer] = {}  # one engine (one scheduler) per model and device


def load_recognizer(name: str = "whisper-tiny.en", **kwargs) -> StreamingRecognizer:
    """A recognizer by name:
    - `whisper-tiny.en` (embedded), another faster-whisper size (`base.en`, `small`, ...; downloads),
      a faster-whisper hub id or a CTranslate2 model directory: the streaming Whisper adapter;
    - `kyutai/...` (hub, needs internet), a local Kyutai STT checkpoint directory, or `tiny-random`
      (random weights, plumbing only): the batched engine in this process, shared by every caller
      asking for the same model (kwargs: `device="cpu"`, `slots=8`, `dtype`, SchedulerConfig fields);
    - `ws://HOST:PORT` / `wss://…`, comma-separated for several: a remote Kyutai-protocol server
      (moshi-server, `duplex asr-serve`; kwargs: `api_key`, `delay_s`).
    """
    kind = recognizer_kind(name)
    if kind == "remote":
        from asr.remote import RemoteRecognizer

        return RemoteRecognizer(name, **kwargs)
    if kind == "engine":
        from asr.engine.recognizer import EngineRecognizer

        key = (os.path.abspath(name) if os.path.isdir(name) else name, tuple(sorted(kwargs.items())))
        if key not in _engines:
            _engines[key] = EngineRecognizer.load(name, **kwargs)
        return _engines[key]
    from asr.whisper_stream import StreamingWhisper

    return StreamingWhisper.load(name, **kwargs)


def recognizer_kind(name: str) -> str:
    """"whisper", "engine" or "remote" for a recognizer name; ValueError saying what is accepted."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("recognizer name is empty")
    name = name.strip()
    if name.startswith(("ws://", "wss://")):
        return "remote"
    if name == "tiny-random" or name.startswith("kyutai/"):
        return "engine"
    if os.path.isdir(name):
        if os.path.isfile(os.path.join(name, "model.bin")):  # CTranslate2 (faster-whisper) layout
            return "whisper"
        config = os.path.join(name, "config.json")
        if os.path.isfile(config):
            try:
                with open(config) as f:
                    model_type = json.load(f).get("model_type")
            except (OSError, ValueError, AttributeError):
                model_type = None
            if model_type == KYUTAI_MODEL_TYPE:
                return "engine"
        raise ValueError(f"{name!r} holds neither a CTranslate2 Whisper model (model.bin) nor a Kyutai STT "
                         f"checkpoint (config.json with model_type {KYUTAI_MODEL_TYPE!r})")
    from faster_whisper.utils import available_models

    size = name.removeprefix("whisper-")
    if size in available_models() or ("/" in name and "whisper" in name.lower()):
        return "whisper"
    raise ValueError(f"unknown recognizer {name!r}: use a Whisper size ({', '.join(available_models())}, "
                     "optionally as whisper-SIZE), a faster-whisper hub id or CTranslate2 directory, "
                     "kyutai/... or a Kyutai STT checkpoint directory, tiny-random, or ws://HOST:PORT[,...]")
