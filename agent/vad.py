"""Silero VAD (ONNX, the copy bundled inside pipecat-ai) as a small stateful frame scorer."""
from __future__ import annotations

from pathlib import Path

import numpy as np

FRAME = 512  # samples per Silero window at 16 kHz (32 ms)
CONTEXT = 64
SAMPLE_RATE = 16000


def bundled_model_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pipecat")  # locate the file without importing pipecat
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pipecat-ai is not installed; it ships the Silero VAD model")
    return Path(list(spec.submodule_search_locations)[0]) / "audio" / "vad" / "data" / "silero_vad.onnx"


class SileroVAD:
    """Scores 512-sample frames of 16 kHz float audio; keeps its recurrent state between calls.

    Blocking (ONNX inference, ~0.4 ms a frame): call it from a worker thread.
    """

    def __init__(self, model_path: str | Path | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(model_path or bundled_model_path()), sess_options=opts,
            providers=["CPUExecutionProvider"])
        self._pending = np.zeros(0, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, CONTEXT), dtype=np.float32)

    def frame_prob(self, frame: np.ndarray) -> float:
        x = np.concatenate([self._context, frame.reshape(1, FRAME).astype(np.float32)], axis=1)
        out, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)})
        self._context = x[:, -CONTEXT:]
        return float(out[0, 0])

    def __call__(self, pcm: np.ndarray) -> list[float]:
        """Append samples; return one speech probability per completed 32 ms frame."""
        buf = np.concatenate([self._pending, np.asarray(pcm, dtype=np.float32).reshape(-1)])
        n = buf.size // FRAME
        probs = [self.frame_prob(buf[i * FRAME:(i + 1) * FRAME]) for i in range(n)]
        self._pending = buf[n * FRAME:]
        return probs
