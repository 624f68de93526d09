"""Smart-turn v3.2 end-of-turn model: the ONNX file bundled inside pipecat-ai, with our own features.

Given the audio of the current user utterance (16 kHz float32 mono), `SmartTurn.probability`
says how likely it is that the user has finished their turn (a sigmoid output in [0, 1]).

What the model expects (read from pipecat's `LocalSmartTurnAnalyzerV3`, pipecat-ai 1.14):
- the last 8 s of 16 kHz audio; shorter audio is zero-padded at the *front*, so the end of
  speech always sits at the end of the window;
- Whisper log-mel features of those 128000 samples: waveform normalized to zero mean and unit
  variance, 400-point periodic-Hann STFT with hop 160 (centered, reflect padding), power
  spectrum, 80 Slaney mel filters over 0-8 kHz, log10 with a 1e-10 floor, the last frame
  dropped (800 frames), clamped to max - 8, then (x + 4) / 4;
- input `input_features` (batch, 80, 800) float32; output `logits` (batch, 1), which is already
  a sigmoid probability.

The feature code is a small numpy re-implementation of that recipe (the math of
`transformers.WhisperFeatureExtractor`, Apache-2.0); importing neither pipecat nor transformers
keeps start-up fast. Blocking (~30 ms a call on one core, ~23 ms on two): call it from a worker
thread.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from asr.base import SPEECH_RATE
from asr.vad import pipecat_asset, quiet_onnx_session
from llm.base import ReadAheadStop

WINDOW_S = 8
N_SAMPLES = SPEECH_RATE * WINDOW_S  # 128000
N_FFT = 400
HOP = 160
N_MELS = 80


def _hz_to_mel(f: np.ndarray) -> np.ndarray:  # Slaney scale: linear below 1 kHz, log above
    f = np.asarray(f, dtype=np.float64)
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) * (27.0 / np.log(6.4)),
                    3.0 * f / 200.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), 200.0 * m / 3.0)


def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SPEECH_RATE) -> np.ndarray:
    """Slaney-normalized triangular mel filterbank, shape (n_fft // 2 + 1, n_mels)."""
    hz = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(rate / 2.0), n_mels + 2))
    fft_hz = np.linspace(0, rate // 2, n_fft // 2 + 1)
    slopes = hz[None, :] - fft_hz[:, None]
    diff = np.diff(hz)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    return fb * (2.0 / (hz[2:n_mels + 2] - hz[:n_mels]))[None, :]


_MEL_T = mel_filters().T  # (n_mels, bins)
_WINDOW = np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window


def fit_window(audio: np.ndarray) -> np.ndarray:
    """Keep the last 8 s; pad shorter audio with zeros at the front."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size >= N_SAMPLES:
        return x[-N_SAMPLES:]
    return np.concatenate([np.zeros(N_SAMPLES - x.size, dtype=np.float32), x])


def log_mel(window: np.ndarray) -> np.ndarray:
    """Whisper log-mel features (80, 800) float32 of exactly 128000 samples of 16 kHz audio."""
    x = np.asarray(window, dtype=np.float32)
    assert x.size == N_SAMPLES, x.size
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)  # float32, as the reference
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _WINDOW, axis=-1)) ** 2  # (frames, bins)
    mel = np.log10(np.maximum(1e-10, _MEL_T @ power.T))[:, :-1]  # (80, 800)
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def as_of_pause(audio_16k: np.ndarray, heard_silence_s: float, pause_s: float) -> np.ndarray:
    """The utterance as it will be when the pause is confirmed: `audio_16k` (ending
    `heard_silence_s` after the speech) followed by zeros for the rest of `pause_s`.

    Smart-turn's verdict depends on the silence after the speech: flite's "What is the capital
    of France?" scored 0.02-0.21 with under 150 ms of it and 0.75-0.95 from 200 ms on. A verdict
    asked for early (at the first silent frame, to have it before the pause) counts only if the
    pause is then confirmed, so it is asked about that audio."""
    unheard = round((pause_s - heard_silence_s) * SPEECH_RATE)
    if unheard <= 0:
        return audio_16k
    return np.concatenate([audio_16k, np.zeros(unheard, dtype=np.float32)])


class SmartTurn:
    """The smart-turn v3.2 end-of-turn classifier (ONNX, CPU, `threads` threads, no spinning)."""

    def __init__(self, model_path: str | Path | None = None, threads: int = 1):
        self.model_path = Path(model_path or pipecat_asset("audio", "turn", "smart_turn", "data",
                                                           "smart-turn-v3.2-cpu.onnx"))
        self._session = quiet_onnx_session(self.model_path, threads)

    def features(self, audio_16k: np.ndarray) -> np.ndarray:
        """(1, 80, 800) model input for the utterance audio (16 kHz float32 in [-1, 1])."""
        return log_mel(fit_window(audio_16k))[None]

    def probability(self, audio_16k: np.ndarray) -> float:
        """Probability that the turn is complete, for the utterance audio up to now. Blocking."""
        (out,) = self._session.run(["logits"], {"input_features": self.features(audio_16k)})
        return float(out.reshape(-1)[0])


class TextTurnScorer:
    """The chat model's own verdict on the user's text (LiveKit's text turn detector, with the
    embedded GGUF): one forward of the chat template up to the end of the user's message, then
    the probability of the end-of-message token (`<|im_end|>`: SmolLM2 and Qwen2.5 both use
    ChatML). The system prompt's tokens stay evaluated between calls (llama.cpp's cache), so
    a call evaluates only the user's words (a few tens of ms for SmolLM2-135M; `duplex bench turns` times it).

    `llama`: a `llama_cpp.Llama` of its own (a context shared with the reply's generation would
    lose the reply's prompt cache). Blocking; not thread-safe: one caller at a time."""

    def __init__(self, llama, system_prompt: str = "You are a friendly voice assistant.",
                 end_token: str = "<|im_end|>"):
        import numpy as _np

        self._np = _np
        self._llm = llama
        self._prefix = f"<|im_start|>system\n{system_prompt}<|im_end|>\n<|im_start|>user\n"
        (self._eot,) = llama.tokenize(end_token.encode(), add_bos=False, special=True)

    @classmethod
    def load(cls, model: str = "smollm2-135m", threads: int = 1, **kwargs) -> TextTurnScorer:
        from llm.bundled import resolve
        from llm.llamacpp import load_llama

        return cls(load_llama(resolve(model), n_ctx=512, n_threads=threads), **kwargs)

    @staticmethod
    def normalize(text: str) -> str:
        """Lower case, no punctuation but apostrophes (as LiveKit's detector): Whisper puts a
        "?" or "." after a cut fragment too ("What is the capital of?"), and with it the
        model's end-of-message probability is high whatever the words."""
        kept = "".join(ch if ch.isalnum() or ch in "' " else " " for ch in text.lower())
        return " ".join(kept.split())

    def probability(self, text: str) -> float:
        """P(end of message | the user said `text`, normalized), in [0, 1]."""
        np = self._np
        llm = self._llm
        self._evaluate(text)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
        e = np.exp(logits - logits.max())
        return float(e[self._eot] / e.sum())

    def warm(self, text: str, stop: ReadAheadStop | None = None) -> None:
        """Evaluate the prompt up to `text` (the words so far, while the user speaks): the check
        at the pause then evaluates only the words that changed after them. Once `stop` is set
        it gives up (the user stopped: the decode needs the cores)."""
        if stop is not None and stop.is_set():
            return
        from llm.llamacpp import stoppable

        with stoppable(self._llm, stop):
            self._evaluate(text)

    def _evaluate(self, text: str) -> None:
        llm = self._llm
        toks = llm.tokenize((self._prefix + self.normalize(text)).encode(), add_bos=False, special=True)
        toks = toks[-(llm.n_ctx() - 1):]
        old = llm.input_ids[:llm.n_tokens].tolist()
        n = 0
        while n < min(len(old), len(toks) - 1) and old[n] == toks[n]:
            n += 1  # reuse the evaluated prefix (the system prompt, the words said before)
        llm.n_tokens = n
        llm.eval(toks[n:])


class CombinedEou:
    """Smart-turn and the text turn model as one end-of-turn object for the listener: `probability`
    (audio, as `SmartTurn`) and `text_probability` (the transcript, as `TextTurnScorer`). The
    "combined" policy (agent/conversation/endpointing.py) needs both; the listener falls back to "rules"
    with an end-of-turn object that has no `text_probability`."""

    def __init__(self, smart_turn: SmartTurn, text: TextTurnScorer):
        self.smart_turn, self.text = smart_turn, text

    def probability(self, audio_16k: np.ndarray) -> float:
        return self.smart_turn.probability(audio_16k)

    def text_probability(self, text: str) -> float:
        return self.text.probability(text)

    def warm_text(self, text: str, stop: ReadAheadStop | None = None) -> None:
        self.text.warm(text, stop)
