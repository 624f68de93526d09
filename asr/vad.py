"""Silero VAD (the ONNX copy bundled inside pipecat-ai): one shared model, a stream per caller.

Also the two small helpers every bundled ONNX model here uses: finding a file inside pipecat-ai
without importing it, and an ONNX session that does not spin idle threads.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from asr.base import SPEECH_RATE

FRAME = 512  # samples per Silero window at 16 kHz (32 ms)
CONTEXT = 64


def pipecat_asset(*parts: str) -> Path:
    """A data file shipped inside pipecat-ai, located without importing pipecat (slow, noisy)."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"pipecat-ai is not installed; it ships {parts[-1]}")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


def quiet_onnx_session(path: str | Path, threads: int = 1):
    """An ONNX Runtime CPU session whose idle workers sleep: spinning workers starve the other
    models on a small CPU (see agent/conversation/models.py)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class SileroVAD:
    """The model: one ONNX session (its `run` is thread-safe), shared by every stream."""

    def __init__(self, model_path: str | Path | None = None):
        self.session = quiet_onnx_session(model_path or pipecat_asset("audio", "vad", "data", "silero_vad.onnx"))

    def new_stream(self) -> "SileroStream":
        return SileroStream(self)


class SileroStream:
    """Scores 16 kHz float audio: call it with any number of samples, get one speech probability
    per completed 512-sample window (the i-th scores stream samples [512 i, 512 (i + 1))).
    Blocking (~0.4 ms a window): call it from a worker thread."""

    def __init__(self, model: SileroVAD):
        self._run = model.session.run
        self._sr = np.array(SPEECH_RATE, dtype=np.int64)
        self._pending = np.zeros(0, dtype=np.float32)  # < 512 samples
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, CONTEXT), dtype=np.float32)

    def __call__(self, pcm: np.ndarray) -> list[float]:
        buf = np.concatenate([self._pending, np.asarray(pcm, dtype=np.float32).reshape(-1)])
        n = buf.size // FRAME
        probs = []
        for i in range(n):
            x = np.concatenate([self._context, buf[i * FRAME:(i + 1) * FRAME].reshape(1, FRAME)], axis=1)
            out, self._state = self._run(None, {"input": x, "state": self._state, "sr": self._sr})
            self._context = x[:, -CONTEXT:]
            probs.append(float(out[0, 0]))
        self._pending = buf[n * FRAME:].copy()
        return probs
