"""Load the model set a session uses, from names (all defaults are embedded, offline)."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from agent.conversation.config import Models
from agent.conversation.endpointing import CombinedPolicy, EndOfTurnPolicy
from llm import bundled

log = logging.getLogger("duplex.models")


def configure_openmp() -> None:
    """CTranslate2 (Whisper), llama.cpp and torch parallelise with OpenMP (libgomp). Idle
    workers that spin for long starve the other models on a small CPU (voice-to-voice grows
    tenfold); workers that never spin (OMP_WAIT_POLICY=PASSIVE) make every operation of every
    llama.cpp token wait for futex wake-ups (a token takes twice as long). A short spin (10,000
    rounds, microseconds) keeps a token's operations back to back and still lets idle workers
    sleep. ACTIVE, with a spin count given, keeps that spin even when libgomp manages more
    threads than there are cores (the text turn model's llama.cpp thread besides the reply's).
    libgomp reads these when it loads: the entry points call this before any model library is
    imported; a user's own setting wins. `duplex bench latency` re-measures the effect."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        os.environ.setdefault("GOMP_SPINCOUNT", "10000")


@dataclass
class ModelChoice:
    asr: str = "whisper-tiny.en"  # see asr.load_recognizer: Whisper, a Kyutai engine, or ws:// URLs
    asr_api_key: str | None = None  # for a ws:// recognizer
    asr_slots: int = 8  # the in-process engine's batch size
    asr_beam: int | None = None  # Whisper's final-decode beam (None: WhisperOptions' default, 5; 1: greedy)
    asr_recheck: bool = True  # an unsure Whisper final is decoded again on the full window (WhisperOptions)
    device: str = "cpu"  # where the in-process engine runs
    llm: str = bundled.DEFAULT  # a name in llm.bundled.BUNDLED | path.gguf | http://host:port/v1
    llm_model: str | None = None  # the model name at an OpenAI-compatible endpoint
    tts: str = "piper"  # piper | path/to/voice.onnx | espeak-ng | flite
    eou: str | None = "smart-turn-v3.2"  # the audio end-of-turn model, for policies that use one
    # the end-of-turn policy (agent/conversation/endpointing.py): one that `uses_text_model` also loads a
    # text model that scores whether the transcript is finished (agent.conversation.eou.TextTurnScorer)
    endpointing: EndOfTurnPolicy = field(default_factory=CombinedPolicy)
    llm_threads: int | None = None


def load_models(choice: ModelChoice | None = None) -> Models:
    configure_openmp()  # before the model libraries load (a caller that loaded them first keeps its own)
    from asr.vad import SileroVAD
    from asr import load_recognizer
    from llm import load_chat_model
    from tts import load_synthesizer

    choice = choice or ModelChoice()
    t = time.perf_counter()
    asr = load_recognizer(choice.asr, **recognizer_options(choice))
    llm = load_chat_model(choice.llm, model=choice.llm_model, n_threads=choice.llm_threads)
    tts = load_synthesizer(choice.tts)
    vad = SileroVAD()
    eou = None
    if choice.eou and choice.endpointing.uses_audio_model:
        from agent.conversation.eou import SmartTurn

        # the session asks it alone (nothing else runs until its verdict): both cores, a
        # quarter quicker than one (`duplex bench turns` times its checks)
        eou = SmartTurn(threads=min(2, os.cpu_count() or 1))
        if choice.endpointing.uses_text_model:
            from agent.conversation.eou import CombinedEou, TextTurnScorer

            eou = CombinedEou(eou, TextTurnScorer.load("smollm2-135m"))
    log.info("models loaded in %.1f s: asr=%s llm=%s tts=%s", time.perf_counter() - t, choice.asr, choice.llm, tts.name)
    return Models(asr=asr, llm=llm, tts=tts, vad_factory=vad.new_stream, eou=eou)


def recognizer_options(choice: ModelChoice) -> dict:
    """The load_recognizer options that apply to the kind of recognizer chosen."""
    from asr import recognizer_kind

    kind = recognizer_kind(choice.asr)
    if kind == "remote":
        return {"api_key": choice.asr_api_key} if choice.asr_api_key else {}
    if kind == "engine":
        return {"device": choice.device, "slots": choice.asr_slots}
    from asr.whisper import WhisperOptions

    changes = {}
    if choice.asr_beam:
        changes["final_beam_size"] = choice.asr_beam
    if not choice.asr_recheck:
        changes["unsure_logprob"] = None
    return {"options": WhisperOptions(**changes)} if changes else {}
