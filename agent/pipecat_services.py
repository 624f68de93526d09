"""duplex's recognizers, chat models and voices as pipecat 1.14 services (thin adapters).

- `DuplexSTTService`: any duplex recognizer (the names `--asr` takes: `whisper-tiny.en`, a Kyutai
  checkpoint or hub id for the in-process engine, `ws://...` for a remote `duplex asr-serve` or
  moshi-server) as a streaming `STTService`. Every sample is fed to the recognizer stream (a causal
  model keeps its context); partials become `InterimTranscriptionFrame`s; at the VAD's end of speech
  the stream is flushed up to it (`request_finalize`/`confirm_finalize`, so pipecat's TTFB is end of
  speech -> final) and the words become one finalized `TranscriptionFrame` whose `result` is a
  `DuplexTranscript` (the words with their stream times). With `enable_eager_end_of_turn` the
  service owns the turn (pipecat's `EagerEndOfTurnSTTServiceMixin`): it proposes turn starts and
  stops, and predicts the end of the turn at a pause whose transcript so far ends a sentence
  (duplex's speculation rule), so pipecat's `EagerUserTurnStrategies` can answer ahead.
- `DuplexLLMService`: an `llm.ChatModel` as an `LLMService`: an `LLMContextFrame` in, streamed
  `LLMTextFrame`s out. An interruption cancels pipecat's frame task, which closes the model's
  stream: generation stops within one token (the ChatModel contract).
- `DuplexTTSService`: a `tts.Synthesizer` as a `TTSService`: audio frames, and word timestamps
  from each chunk's text span (words spread over the chunk's audio by characters), so pipecat's
  assistant context keeps the words that were played.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np
from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InterimTranscriptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    StartFrame,
    STTMetadataFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService
from pipecat.turns.eager_end_of_turn_mixin import EagerEndOfTurnSTTServiceMixin
from pipecat.utils.time import time_now_iso8601

from asr.base import Partial, RecognizerFailed, StreamingRecognizer, Utterances, Word
from asr.words import HeardWords
from llm import bundled
from llm.base import ChatModel, Message
from tts.base import Synthesizer, known_text
from tts.chunking import ends_sentence, has_words

__all__ = ["DuplexLLMService", "DuplexSTTService", "DuplexTTSService", "DuplexTranscript", "word_times"]


@dataclass(frozen=True)
class DuplexTranscript:
    """`TranscriptionFrame.result` of DuplexSTTService: the words, times in seconds of stream time
    (the audio the service has fed since it started)."""

    text: str
    words: tuple[Word, ...]
    until_s: float  # the end of speech the transcript was flushed up to


def _recognizer(asr: str | StreamingRecognizer, **kwargs) -> StreamingRecognizer:
    if isinstance(asr, str):
        from agent.conversation.models import ModelChoice, recognizer_options
        from asr import load_recognizer

        options = recognizer_options(ModelChoice(asr=asr)) | kwargs
        return load_recognizer(asr, **options)
    return asr


# ---- speech to text -----------------------------------------------------------------------------
class DuplexSTTService(EagerEndOfTurnSTTServiceMixin, STTService):
    """A duplex recognizer stream as a pipecat streaming STT service (see the module's notes)."""

    def __init__(self, *, asr: str | StreamingRecognizer = "whisper-tiny.en", asr_options: dict | None = None,
                 preroll_s: float = 0.3, final_pad_s: float = 0.12, ttfs_p99_latency: float = 1.0,
                 turn_stop_s: float = 0.3, **kwargs):
        """`asr`: a recognizer name as `--asr` takes (loaded here) or a loaded recognizer.
        `preroll_s`: audio before the VAD's start of speech given to an utterance decoder (Whisper).
        `final_pad_s`: audio after the end of speech that the final transcript may use.
        `turn_stop_s`: with `enable_eager_end_of_turn`, silence after the final transcript
        before the service proposes the end of the turn."""
        recognizer = _recognizer(asr, **(asr_options or {}))
        if "settings" not in kwargs:
            from pipecat.services.settings import STTSettings

            kwargs["settings"] = STTSettings(model=getattr(recognizer, "name", None), language=None)
        # pipecat closes a TTFB measurement that no finalized transcript ended within its
        # timeout (2 s); this service always finalizes, so wait as long as a busy CPU needs
        kwargs.setdefault("stt_ttfb_timeout", 10.0)
        super().__init__(ttfs_p99_latency=ttfs_p99_latency, **kwargs)
        self._recognizer = recognizer
        self._preroll_s, self._final_pad_s, self._turn_stop_s = preroll_s, final_pad_s, turn_stop_s
        self._stream = None
        self._utterances: Utterances | None = None
        self._resampler = None
        self._t_audio = 0.0  # stream time: seconds of audio fed
        self._words = HeardWords()
        self._events_task: asyncio.Task | None = None
        self._final_task: asyncio.Task | None = None
        self._eager_task: asyncio.Task | None = None
        self._turn_stop_task: asyncio.Task | None = None
        self._speech_started_at: float | None = None
        self._in_turn = False
        self._vad_speaking = False
        # speech that resumed while the previous segment's final was decoding: (that final, where
        # the new segment starts), oldest first; each utterance begins once its final is done
        self._pending_begins: list[tuple[asyncio.Task, float]] = []
        self._begin_task: asyncio.Task | None = None
        self._flushed_until = 0.0  # stream time the latest final was asked up to
        self._last_partial: Partial | None = None

    @property
    def recognizer(self) -> StreamingRecognizer:
        return self._recognizer

    def can_generate_metrics(self) -> bool:
        return True

    def service_metadata_frame(self) -> STTMetadataFrame:
        frame = super().service_metadata_frame()
        if self.eager_end_of_turn_enabled:  # the service owns the turn: pipecat resolves its proposals
            frame.user_turn_strategies = self.recommended_user_turn_strategies(enable_interruptions=True)
        return frame

    # ---- lifetime ---------------------------------------------------------------------------
    async def start(self, frame: StartFrame):
        await super().start(frame)
        if self._stream is None:
            self._stream = await self._recognizer.open_stream()
            self._utterances = self._stream if isinstance(self._stream, Utterances) else None
            if self._utterances is not None:
                self._utterances.speaking(False)  # until the VAD hears speech
            self._events_task = self.create_task(self._read_events(), name="duplex-asr-events")

    async def stop(self, frame: EndFrame):
        # a final transcript under way is pushed before the EndFrame goes on
        if self._final_task is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(30):
                    await asyncio.shield(self._final_task)
        await self._close_stream()
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame):
        await self._close_stream()
        await super().cancel(frame)

    async def _close_stream(self) -> None:
        for task in (self._eager_task, self._turn_stop_task, self._begin_task, self._final_task):
            if task is not None and not task.done():
                await self.cancel_task(task)
        self._eager_task = self._turn_stop_task = self._begin_task = self._final_task = None
        self._pending_begins.clear()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.close()
        if self._events_task is not None:
            await self.cancel_task(self._events_task)
            self._events_task = None
        self._stream = None

    # ---- audio ------------------------------------------------------------------------------
    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        if self._stream is None or not audio:
            yield None
            return
        from transport.audio import StreamResampler

        rate = self._stream.sample_rate
        if self._resampler is None or self._resampler.in_rate != self.sample_rate:
            self._resampler = StreamResampler(self.sample_rate, rate)
        pcm = self._resampler(np.frombuffer(audio, dtype=np.int16).astype(np.float32) / 32768.0)
        if pcm.size:
            self._t_audio += pcm.size / rate
            try:
                await self._stream.feed(pcm)
            except (RecognizerFailed, RuntimeError) as e:
                yield ErrorFrame(f"{self}: recognizer failed: {e}")
                return
        yield None

    # ---- the VAD's view -----------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection):
        if isinstance(frame, VADUserStartedSpeakingFrame):
            await self._speech_started(frame)
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            await self._speech_stopped(frame)
        await super().process_frame(frame, direction)

    async def _speech_started(self, frame: VADUserStartedSpeakingFrame) -> None:
        for task in (self._eager_task, self._turn_stop_task):
            if task is not None and not task.done():
                await self.cancel_task(task)
        self._eager_task = self._turn_stop_task = None
        await self._cancel_eager_end_of_turn()  # the user went on: a prediction is void
        self._vad_speaking = True
        if self._utterances is not None:
            start = max(0.0, self._t_audio - (frame.start_secs or 0.0) - self._preroll_s)
            if self._final_task is None or self._final_task.done():
                self._utterances.begin_utterance(start)
                self._utterances.speaking(True)
            else:  # restarting the decoder now would spoil that final; begin right after it
                self._pending_begins.append((self._final_task, max(start, self._flushed_until)))
                self._begin_task = self.create_task(self._begin_after(self._final_task), name="duplex-asr-begin")
        if self.eager_end_of_turn_enabled and not self._in_turn:
            self._in_turn = True
            await self.broadcast_frame(ProposedUserStartedSpeakingFrame)

    async def _begin_after(self, final: asyncio.Task) -> None:
        await asyncio.wait({final})  # not `await final`: cancelling this must not cancel it
        self._begin_pending(after=final)

    def _begin_pending(self, after: asyncio.Task | None) -> None:
        """Begin the utterance of speech that resumed during the final `after` (now done)."""
        pending = self._pending_begins
        if self._utterances is None or not pending or pending[0][0] is not after:
            return
        _, start = pending.pop(0)
        self._utterances.begin_utterance(start)
        self._utterances.speaking(self._vad_speaking and not pending)  # a later one began: this one ended

    async def _pending_begun(self) -> None:
        """Wait for (and make) the pending begins: the audio since is a new utterance."""
        while self._pending_begins:
            final = self._pending_begins[0][0]
            await asyncio.wait({final})
            self._begin_pending(after=final)

    async def _speech_stopped(self, frame: VADUserStoppedSpeakingFrame) -> None:
        self._vad_speaking = False
        if self._stream is None:
            return
        if self._utterances is not None:
            self._utterances.speaking(False)
        speech_end = max(0.0, self._t_audio - (frame.stop_secs or 0.0))
        until = min(speech_end + self._final_pad_s, self._t_audio) if frame.stop_secs else self._t_audio
        self._flushed_until = until
        if self.eager_end_of_turn_enabled:
            self._eager_task = self.create_task(self._predict_end_of_turn(until), name="duplex-asr-eager")
        previous = self._final_task
        self._final_task = self.create_task(self._final_transcript(until, previous), name="duplex-asr-final")

    async def _predict_end_of_turn(self, until: float) -> None:
        """duplex's speculation rule: the transcript at the pause ends a sentence."""
        if self._utterances is not None:
            await self._pending_begun()
            text = (await self._utterances.decode_early(until)).text.strip()
        else:  # a causal stream: what it has said so far, if it all is stable
            p = self._last_partial
            text = p.text.strip() if p is not None and p.stable_text.strip() == p.text.strip() else ""
        if has_words(text) and ends_sentence(text):
            await self._push_eager_end_of_turn(text, user_id=self._user_id)

    async def _final_transcript(self, until: float, previous: asyncio.Task | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
            self._begin_pending(after=previous)  # speech that resumed during it is this utterance
        self.request_finalize()
        await self.start_processing_metrics()
        try:
            await self._words.flush(self._stream, until)
        except (RecognizerFailed, RuntimeError) as e:
            await self.stop_processing_metrics()
            await self.push_error(f"{self}: final transcript failed: {e}", exception=e)
            return
        await self.stop_processing_metrics()
        text, words = self._words.take(until)
        self._last_partial = None
        logger.debug(f"{self}: final transcript up to {until:.2f} s: [{text}]")
        if not has_words(text):
            await self._cancel_eager_end_of_turn()
            return
        self.confirm_finalize()
        await self.emit_stt_usage_metrics()
        await self.push_frame(TranscriptionFrame(text, self._user_id, time_now_iso8601(),
                                                 result=DuplexTranscript(text, words, until)))
        if self.eager_end_of_turn_enabled:
            self._clear_eager_end_of_turn()
            self._turn_stop_task = self.create_task(self._propose_turn_stop(), name="duplex-turn-stop")

    async def _propose_turn_stop(self) -> None:
        await asyncio.sleep(self._turn_stop_s)  # a short silence more, unless speech resumes
        self._in_turn = False
        await self.broadcast_frame(ProposedUserStoppedSpeakingFrame)

    async def _read_events(self) -> None:
        try:
            async for ev in self._stream.events():
                if self._words.on_event(ev):
                    continue
                if isinstance(ev, Partial) and ev.text.strip():
                    self._last_partial = ev
                    await self.push_frame(InterimTranscriptionFrame(ev.text, self._user_id, time_now_iso8601(),
                                                                    result=ev))
        except RecognizerFailed as e:
            await self.push_error(f"{self}: recognizer stream failed: {e}", exception=e)


# ---- LLM ----------------------------------------------------------------------------------------
def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


class DuplexLLMService(LLMService):
    """An `llm.ChatModel` (`llm.load_chat_model(name)`, or a name) as a pipecat LLM service."""

    def __init__(self, *, llm: str | ChatModel = bundled.DEFAULT, max_tokens: int | None = 200,
                 system_instruction: str | None = None, **kwargs):
        if "settings" not in kwargs:  # a store: every field given
            from pipecat.services.settings import LLMSettings

            kwargs["settings"] = LLMSettings(
                model=getattr(llm, "name", str(llm)), system_instruction=system_instruction, temperature=None,
                max_tokens=max_tokens, top_p=None, top_k=None, frequency_penalty=None, presence_penalty=None,
                seed=None, filter_incomplete_user_turns=False, user_turn_completion_config=None,
                use_provider_thinking_default=False)
        super().__init__(**kwargs)
        if isinstance(llm, str):
            from llm import load_chat_model

            llm = load_chat_model(llm)
        self._chat = llm
        self._max_tokens = max_tokens

    @property
    def chat_model(self) -> ChatModel:
        return self._chat

    def can_generate_metrics(self) -> bool:
        return True

    async def messages_of(self, context: LLMContext) -> list[Message]:
        """The context as duplex chat messages (system instruction first; tool turns dropped)."""
        instruction = getattr(self._settings, "system_instruction", None)
        params = await self.get_llm_adapter().get_llm_invocation_params(
            context, system_instruction=instruction if isinstance(instruction, str) else None,
            convert_developer_to_user=False)
        out: list[Message] = []
        for m in params.get("messages", []):
            role = m.get("role") if isinstance(m, dict) else None
            if role == "developer":
                role = "system"
            if role not in ("system", "user", "assistant"):
                continue
            text = _text_of(m.get("content"))
            if text.strip():
                out.append({"role": role, "content": text})
        return out

    async def run_inference(self, context: LLMContext, max_tokens: int | None = None,
                            system_instruction: str | None = None, response_schema=None) -> str | None:
        messages = await self.messages_of(context)
        if system_instruction:
            messages = [{"role": "system", "content": system_instruction}] + [m for m in messages if m["role"] != "system"]
        pieces = [p async for p in self._chat.stream(messages, max_tokens or self._max_tokens)]
        return "".join(pieces) or None

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self._generate(frame.context)
        else:
            await self.push_frame(frame, direction)

    async def _generate(self, context: LLMContext) -> None:
        # an interruption cancels this task (pipecat's frame task): aclosing stops the model
        await self.push_frame(LLMFullResponseStartFrame())
        await self.start_processing_metrics()
        await self.start_ttfb_metrics()
        try:
            messages = await self.messages_of(context)
            first = True
            async with contextlib.aclosing(self._chat.stream(messages, self._max_tokens)) as pieces:
                async for piece in pieces:
                    if first:
                        await self.stop_ttfb_metrics()
                        first = False
                    if piece:
                        await self._push_llm_text(piece)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported, the pipeline goes on
            await self.push_error(error_msg=f"{self}: generation failed: {e}", exception=e)
        finally:
            await self.stop_processing_metrics()
        await self.push_frame(LLMFullResponseEndFrame())


# ---- text to speech -----------------------------------------------------------------------------
def word_times(text: str, start_s: float, duration_s: float) -> list[tuple[str, float]]:
    """The words of a chunk that speaks `text` in [start_s, start_s + duration_s): each word's start,
    spread over the chunk by characters (a voice says longer words for longer)."""
    words = text.split()
    total = sum(len(w) + 1 for w in words)
    out, before = [], 0
    for w in words:
        out.append((w, start_s + duration_s * before / max(total, 1)))
        before += len(w) + 1
    return out


class DuplexTTSService(TTSService):
    """A `tts.Synthesizer` (`tts.load_synthesizer(name)`, or a name) as a pipecat TTS service."""

    def __init__(self, *, voice: str | Synthesizer = "piper", **kwargs):
        kwargs.setdefault("push_text_frames", False)  # the words come as timed TTSTextFrames
        kwargs.setdefault("push_stop_frames", True)
        kwargs.setdefault("push_start_frame", True)
        if isinstance(voice, str):
            from tts import load_synthesizer

            voice = load_synthesizer(voice)
        if "settings" not in kwargs:
            from pipecat.services.settings import TTSSettings

            kwargs["settings"] = TTSSettings(model=None, voice=getattr(voice, "name", None), language=None)
        super().__init__(**kwargs)
        self._voice = voice
        self._audio_resampler = create_stream_resampler()
        self._context_id: str | None = None
        self._context_t = 0.0  # seconds of audio produced so far in this context

    @property
    def synthesizer(self) -> Synthesizer:
        return self._voice

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if context_id != self._context_id:  # pipecat times words from its context's first audio
            self._context_id, self._context_t = context_id, 0.0

        await self.start_tts_usage_metrics(text)
        async with contextlib.aclosing(self._voice.stream(known_text(text))) as chunks:
            async for chunk in chunks:
                if chunk.error or not chunk.pcm.size:
                    if chunk.error:
                        logger.warning(f"{self}: the voice could not speak {chunk.text!r}: {chunk.error}")
                    continue
                await self.stop_ttfb_metrics()
                audio = chunk.pcm.astype(np.int16).tobytes()
                if chunk.sample_rate != self.sample_rate:
                    audio = await self._audio_resampler.resample(audio, chunk.sample_rate, self.sample_rate)
                await self.add_word_timestamps(word_times(chunk.text, self._context_t, chunk.duration), context_id)
                self._context_t += chunk.duration
                yield TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=context_id)
