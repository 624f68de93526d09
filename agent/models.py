"""Load the model set a session uses, from names (all defaults are embedded, offline)."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

# CTranslate2 (Whisper), llama.cpp and torch parallelise with OpenMP (libgomp). Idle workers
# that spin for long starve the other models on a small CPU (once measured here: 1.3 s -> 17 s
# voice-to-voice). Workers that never spin (OMP_WAIT_POLICY=PASSIVE, used until 2026-11-30)
# are as bad for llama.cpp: every operation of every token then waits for futex wake-ups,
# 16 -> 33 ms a token here. A short spin (10,000 rounds, microseconds) keeps a token's
# operations back to back and still lets idle workers sleep. ACTIVE, with a spin count given,
# only keeps that spin when libgomp manages more threads than there are cores (else it spins
# 100 rounds): once the text turn model had run llama.cpp from a second thread, the reply's
# tokens took 70 ms instead of 41 for the rest of the process. libgomp reads these when it
# loads, so they are set before any model library loads; a user's own setting wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from agent.config import Models
from agent.endpointing import CombinedPolicy, EndOfTurnPolicy
from llm import bundled

log = logging.getLogger("duplex.models")


@dataclass
class ModelChoice:
    asr: str = "whisper-tiny.en"  # see asr.load_recognizer: Whisper, a Kyutai engine, or ws:// URLs
    asr_api_key: str | None = None  # for a ws:// recognizer
    asr_slots: int = 8  # the in-process engine's batch size
    asr_beam: int | None = None  # Whisper's final-decode beam (None: WhisperOptions' default, 5; 1: greedy)
    device: str = "cpu"  # where the in-process engine runs
    llm: str = bundled.DEFAULT  # a name in llm.bundled.BUNDLED | path.gguf | http://host:port/v1
    llm_model: str | None = None  # the model name at an OpenAI-compatible endpoint
    tts: str = "piper"  # piper | path/to/voice.onnx | espeak-ng | flite
    eou: str | None = "smart-turn-v3.2"  # the audio end-of-turn model, for policies that use one
    # the end-of-turn policy (agent/endpointing.py): one that `uses_text_model` also loads a
    # text model that scores whether the transcript is finished (agent.eou.TextTurnScorer)
    endpointing: EndOfTurnPolicy = field(default_factory=CombinedPolicy)
    llm_threads: int | None = None


def load_models(choice: ModelChoice | None = None) -> Models:
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
        from agent.eou import SmartTurn

        # the session asks it alone (nothing else runs until its verdict): both cores, ~23 ms
        # a check here against ~30 ms on one (after 100 ms idle, 6 dev clips)
        eou = SmartTurn(threads=min(2, os.cpu_count() or 1))
        if choice.endpointing.uses_text_model:
            from agent.eou import CombinedEou, TextTurnScorer

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
    if choice.asr_beam:
        from asr.whisper import WhisperOptions

        return {"options": WhisperOptions(final_beam_size=choice.asr_beam)}
    return {}
