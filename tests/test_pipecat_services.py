"""duplex's recognizers, chat model and voice as pipecat 1.14 services, run by pipecat's own test
harness (pipecat.tests.utils.run_test) and pipeline worker, on the real models."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import soundfile as sf
from helpers import DEV, LONG_STORY, await_until, dev_reference, duplex_asr_serve

pytestmark = pytest.mark.models

CLIP = "sense_and_sensibility_01_austen_64kb-0870.wav"  # 7 s: partials while it is spoken


def _audio_frames(audio: np.ndarray, rate: int, trailing_s: float = 1.0) -> list:
    """The clip, then silence, as 20 ms InputAudioRawFrames paced at real time (pipecat's
    SleepFrame between every 100 ms), as a transport delivers them."""
    from pipecat.frames.frames import InputAudioRawFrame
    from pipecat.tests.utils import SleepFrame

    x = np.concatenate([audio, np.zeros(int(trailing_s * rate), np.float32)])
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    step = rate // 50
    frames = []
    for n, i in enumerate(range(0, pcm.size, step)):
        frames.append(InputAudioRawFrame(pcm[i:i + step].tobytes(), rate, 1))
        if n % 5 == 4:
            frames.append(SleepFrame(sleep=0.1))
    return frames


async def _transcribe(asr) -> tuple[list, list]:
    """The dev clip through pipecat's Silero VAD and a DuplexSTTService; the frames that came out."""
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.tests.utils import run_test

    from agent.pipecat_services import DuplexSTTService

    audio, rate = sf.read(DEV / CLIP, dtype="float32")
    stt = DuplexSTTService(asr=asr)
    down, _ = await run_test(
        Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt]),
        frames_to_send=_audio_frames(audio, rate),
        pipeline_params=PipelineParams(audio_in_sample_rate=rate, enable_metrics=True),
        start_timeout=30.0,
    )
    return down, stt


def _check_transcript(down: list, limit: float) -> None:
    from pipecat.frames.frames import (
        InterimTranscriptionFrame,
        MetricsFrame,
        TranscriptionFrame,
    )
    from pipecat.metrics.metrics import TTFBMetricsData

    from agent.pipecat_services import DuplexTranscript
    from asr.wer import wer

    interim = [f for f in down if isinstance(f, InterimTranscriptionFrame)]
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert interim, "no interim transcription"
    assert len(finals) == 1, [f.text for f in finals]
    final = finals[0]
    assert final.finalized  # request_finalize / confirm_finalize
    assert down.index(interim[0]) < down.index(final)
    result = final.result
    assert isinstance(result, DuplexTranscript) and result.words
    assert all(a.start <= b.start and w.start <= w.end for a, b, w in zip(result.words, result.words[1:], result.words))
    assert result.words[-1].end <= result.until_s + 0.5
    score = wer([dev_reference(CLIP)], [final.text])
    print(f"final {final.text!r} WER {score:.3f}")
    assert score <= limit
    ttfb = [d for f in down if isinstance(f, MetricsFrame) for d in f.data
            if isinstance(d, TTFBMetricsData) and "DuplexSTTService" in d.processor and d.value > 0]
    assert len(ttfb) == 1 and ttfb[0].value < 5, ttfb  # end of speech -> the finalized transcript


@pytest.fixture(scope="module")
def whisper():
    from asr import load_recognizer

    return load_recognizer("whisper-tiny.en")


async def test_stt_embedded_whisper_interim_and_final(whisper):
    down, _ = await _transcribe(whisper)
    _check_transcript(down, limit=0.12)  # the embedded Whisper's WER on the dev set


async def test_stt_remote_asr_serve():
    with duplex_asr_serve() as url:
        down, _ = await _transcribe(url)
    _check_transcript(down, limit=0.12)


async def test_stt_keeps_speech_that_resumes_while_the_previous_final_decodes(whisper, tmp_path):
    """flite pauses after "Hello," long enough for pipecat's VAD to stop (0.2 s) and start again
    while that segment's final is still decoding: the resumed speech is a new utterance, begun
    once that final is done, not lost (it was: only "Hello?" came out)."""
    from helpers import say
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.tests.utils import run_test

    from agent.pipecat_services import DuplexSTTService
    from asr.wer import wer

    said = "Hello, can you hear me?"
    audio = np.concatenate([np.zeros(8000, np.float32), say(said, tmp_path / "q.wav")])
    down, _ = await run_test(
        Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), DuplexSTTService(asr=whisper)]),
        frames_to_send=_audio_frames(audio, 16000, trailing_s=2.0),
        pipeline_params=PipelineParams(audio_in_sample_rate=16000), start_timeout=30.0,
    )
    heard = " ".join(f.text for f in down if isinstance(f, TranscriptionFrame))
    print(f"finals: {heard!r}")
    assert wer([said], [heard]) <= 0.2


async def test_stt_eager_end_of_turn_comes_before_the_final(whisper, tmp_path):
    """With `enable_eager_end_of_turn` the service owns the turn: at the VAD's pause, a transcript
    that ends a sentence (duplex's speculation rule, the recognizer's early decode) is pushed as
    pipecat's EagerTranscriptionFrame before the final TranscriptionFrame, and the turn's end
    is proposed only after the final."""
    import time

    from helpers import say
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        EagerTranscriptionFrame,
        ProposedUserStartedSpeakingFrame,
        ProposedUserStoppedSpeakingFrame,
        STTMetadataFrame,
        TranscriptionFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.tests.utils import run_test
    from pipecat.turns.user_turn_strategies import EagerUserTurnStrategies

    from agent.pipecat_services import DuplexSTTService
    from asr.wer import wer

    class Clock(FrameProcessor):  # when each frame left the service
        def __init__(self):
            super().__init__()
            self.seen: list[tuple[float, object]] = []

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            self.seen.append((time.perf_counter(), frame))
            await self.push_frame(frame, direction)

    question = "What is the capital of France?"
    audio = np.concatenate([np.zeros(8000, np.float32), say(question, tmp_path / "q.wav")])
    stt, clock = DuplexSTTService(asr=whisper, enable_eager_end_of_turn=True), Clock()

    def frames():  # the question, then silence at real time until the end of turn was proposed
        yield from _audio_frames(audio, 16000, trailing_s=1.0)
        for _ in range(300):  # at most 30 s
            if any(isinstance(f, ProposedUserStoppedSpeakingFrame) for _, f in clock.seen):
                return
            yield from _audio_frames(np.zeros(1600, np.float32), 16000, trailing_s=0.0)

    down, _ = await run_test(
        Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt, clock]),
        frames_to_send=frames(),
        pipeline_params=PipelineParams(audio_in_sample_rate=16000), start_timeout=30.0,
    )
    meta = [f for f in down if isinstance(f, STTMetadataFrame)]
    assert meta and isinstance(meta[-1].user_turn_strategies, EagerUserTurnStrategies)
    eager = [f for f in down if isinstance(f, EagerTranscriptionFrame)]
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert len(eager) == 1 and len(finals) == 1, ([f.text for f in eager], [f.text for f in finals])
    started = [i for i, f in enumerate(down) if isinstance(f, ProposedUserStartedSpeakingFrame)]
    stopped = [i for i, f in enumerate(down) if isinstance(f, ProposedUserStoppedSpeakingFrame)]
    assert started and started[0] < down.index(eager[0]) < down.index(finals[0])  # the early signal first
    assert stopped and stopped[0] > down.index(finals[0])  # the committed end of turn after the final
    assert wer([question], [eager[0].text]) <= 0.34 and wer([eager[0].text], [finals[0].text]) == 0
    t = {id(f): at for at, f in clock.seen}
    lead = t[id(finals[0])] - t[id(eager[0])]
    print(f"eager {eager[0].text!r} {lead * 1000:.0f} ms before the final, "
          f"{(t[id(down[stopped[0]])] - t[id(eager[0])]) * 1000:.0f} ms before the proposed end of turn")
    assert lead > 0


@pytest.fixture(scope="module")
def smollm():
    from llm import load_chat_model

    return load_chat_model("smollm2-135m")


async def test_llm_context_streams_text(smollm):
    from pipecat.frames.frames import (
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.tests.utils import run_test

    from agent.pipecat_services import DuplexLLMService

    llm = DuplexLLMService(llm=smollm, max_tokens=40, system_instruction="You answer in one short sentence.")
    context = LLMContext(messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert (await llm.messages_of(context))[0] == {"role": "system", "content": "You answer in one short sentence."}
    down, _ = await run_test(llm, frames_to_send=[LLMContextFrame(context)], start_timeout=30.0)
    kinds = [type(f) for f in down]
    assert LLMFullResponseStartFrame in kinds and LLMFullResponseEndFrame in kinds
    texts = [f.text for f in down if isinstance(f, LLMTextFrame)]
    assert len(texts) >= 2, texts  # streamed, not one block
    assert kinds.index(LLMFullResponseStartFrame) < kinds.index(LLMTextFrame) < kinds.index(LLMFullResponseEndFrame)
    print("reply:", "".join(texts))
    assert any(ch.isalnum() for ch in "".join(texts))


@pytest.fixture(scope="module")
def piper():
    from tts import load_synthesizer

    return load_synthesizer("piper")


async def test_tts_audio_and_word_timestamps(piper):
    from pipecat.frames.frames import (
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStartedFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.tests.utils import run_test

    from agent.pipecat_services import DuplexTTSService

    text = "Hello there. The capital of France is Paris, a city on the Seine."
    tts = DuplexTTSService(voice=piper)
    down, _ = await run_test(tts, frames_to_send=[TTSSpeakFrame(text)],
                             pipeline_params=PipelineParams(audio_out_sample_rate=24000), start_timeout=30.0)
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert audio and all(f.sample_rate == 24000 for f in audio)
    assert any(isinstance(f, TTSStartedFrame) for f in down) and any(isinstance(f, TTSStoppedFrame) for f in down)
    seconds = sum(len(f.audio) for f in audio) / 2 / 24000
    assert 2.0 < seconds < 10.0
    assert " ".join(w.text for w in words).split() == text.split()
    pts = [w.pts for w in words]
    assert all(p is not None for p in pts)
    assert pts == sorted(pts)  # in order
    assert (pts[-1] - pts[0]) / 1e9 < seconds  # within the audio's length


async def test_tts_keeps_the_start_of_the_voice_audio(piper):
    """The first reply audio frame is the voice's first chunk resampled (22.05 -> 24 kHz), from
    its first sample: pipecat's stream resampler holds back only the end of a chunk (its filter
    delay), never the start, so no word onset is lost or faded."""
    import soxr
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.tests.utils import run_test

    from agent.pipecat_services import DuplexTTSService

    class Recording:  # the real voice; what it synthesized, kept
        def __init__(self, inner):
            self.inner, self.name, self.chunks = inner, inner.name, []

        async def stream(self, texts):
            async for chunk in self.inner.stream(texts):
                self.chunks.append(chunk)
                yield chunk

    voice = Recording(piper)
    down, _ = await run_test(DuplexTTSService(voice=voice), frames_to_send=[TTSSpeakFrame("Paris is in France.")],
                             pipeline_params=PipelineParams(audio_out_sample_rate=24000), start_timeout=30.0)
    first = next(f for f in down if isinstance(f, TTSAudioRawFrame))
    got = np.frombuffer(first.audio, np.int16).astype(np.float64)
    chunk = voice.chunks[0]
    assert chunk.sample_rate != 24000  # the resampler is on the path
    ref = soxr.resample(chunk.pcm.astype(np.float32), chunk.sample_rate, 24000, quality="VHQ").astype(np.float64)
    # soxr hands out whole blocks: it holds back 17-36 ms of a chunk's end (Piper ends a chunk
    # with ~200 ms of silence), and nothing of its start
    assert ref.size - 24 * 50 <= got.size <= ref.size
    onset = int(np.argmax(np.abs(ref) > 0.01 * 32767))  # Piper speaks within ~10 ms
    assert onset < 24 * 100
    n = onset + 24 * 50  # up to 50 ms into the first word, sample for sample (int16 rounding apart)
    diff = np.abs(got[:n] - ref[:n]).max()
    print(f"onset {onset / 24:.1f} ms; the first {n / 24:.0f} ms differ by at most {diff:.2f} (of 32767); "
          f"{(ref.size - got.size) / 24:.1f} ms of the end held back")
    assert diff <= 2.0


class _Counting:
    """A real chat model or voice, watched: how many pieces it produced, whether its stream closed."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.sample_rate = getattr(inner, "sample_rate", None)
        self.produced = 0
        self.opened = 0
        self.closed = 0

    async def stream(self, *args, **kwargs):
        self.opened += 1
        try:
            async for piece in self.inner.stream(*args, **kwargs):
                self.produced += 1
                yield piece
        finally:
            self.closed += 1


async def test_interruption_cancels_generation_and_synthesis(smollm, piper):
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InterruptionFrame,
        LLMContextFrame,
        LLMTextFrame,
        StartFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from agent.pipecat_services import DuplexLLMService, DuplexTTSService

    class Sink(FrameProcessor):
        def __init__(self):
            super().__init__()
            self.frames: list[Frame] = []

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, StartFrame):
                self.frames.append(frame)
            await self.push_frame(frame, direction)

    chat, voice = _Counting(smollm), _Counting(piper)
    sink = Sink()
    worker = PipelineWorker(Pipeline([DuplexLLMService(llm=chat, max_tokens=400), DuplexTTSService(voice=voice), sink]),
                            params=PipelineParams(audio_out_sample_rate=24000), cancel_on_idle_timeout=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        context = LLMContext(messages=list(LONG_STORY))
        await worker.queue_frame(LLMContextFrame(context))
        assert await await_until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in sink.frames), 60)
        assert chat.closed == 0, "the story ended before the interruption"
        produced = chat.produced
        await worker.queue_frame(InterruptionFrame())
        assert await await_until(lambda: chat.closed == chat.opened and voice.closed == voice.opened, 10)
        assert chat.produced <= produced + 1  # within one token
        assert await await_until(lambda: any(isinstance(f, InterruptionFrame) for f in sink.frames), 10)
        cut = next(i for i, f in enumerate(sink.frames) if isinstance(f, InterruptionFrame))
        # frames are ordered: once the EndFrame queued after the interruption has come through,
        # nothing of the interrupted reply is still on its way
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 30)
        after = [f for f in sink.frames[cut:] if isinstance(f, (LLMTextFrame, TTSAudioRawFrame))]
        assert not after, f"{len(after)} frames of the reply after the interruption"
        assert voice.opened == voice.closed and chat.opened == 1
    finally:
        if not running.done():
            running.cancel()
