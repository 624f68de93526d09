"""`duplex asr-serve`: a WebSocket server wire-compatible with Kyutai moshi-server's ASR endpoint.

Path `/api/asr-streaming`, msgpack frames (asr/PROTOCOL.md), `kyutai-api-key` header (or the
`auth_id` query parameter, as moshi-server also accepts). It serves any `Recognizer`
(asr.scheduler): by default the embedded Whisper recognizer (whisper-tiny.en, a real speech
model that works offline), or the batched Kyutai engine with `--model`: a Kyutai STT checkpoint
(hub id, needs internet, or a local directory) or `tiny-random` (random weights, NOT a speech
model: for trying the plumbing).

Backpressure: the reader awaits `session.feed`, which waits while the session's input buffer
is full; meanwhile nothing more is read from that socket and websockets' small incoming queue
fills, so the server stops reading from TCP and the client's sends block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve

from asr.moshi_protocol import (
    Audio,
    Error,
    Flush,
    Init,
    Marker,
    ProtocolError,
    Ready,
    decode_client,
    encode_server,
)
from asr.scheduler import NoFreeSlot, Recognizer, SessionClosed

PATH = "/api/asr-streaming"
DEFAULT_API_KEYS = ("public_token",)
# Incoming frames larger than this close the connection (1009) before we can parse them; the
# largest valid Audio message (MAX_PCM_SAMPLES float64) is about 2.2 MB.
MAX_FRAME_BYTES = 4 * 2**20
INCOMING_QUEUE = 2  # websockets' per-connection queue of received frames: keep it small

log = logging.getLogger("duplex.asr.server")


class AsrServer:
    """Serves one Recognizer over WebSocket."""

    def __init__(self, recognizer: Recognizer, api_keys: tuple[str, ...] | None = DEFAULT_API_KEYS):
        self.recognizer = recognizer
        self.api_keys = None if api_keys is None else frozenset(api_keys)
        self.connections = 0
        self.protocol_errors = 0

    def process_request(self, connection: ServerConnection, request):
        url = urlsplit(request.path)
        if url.path != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"only {PATH} is served\n")
        if self.api_keys is not None:
            key = request.headers.get("kyutai-api-key") or (parse_qs(url.query).get("auth_id") or [None])[0]
            if key not in self.api_keys:
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong kyutai-api-key\n")
        return None

    async def handle(self, ws: ServerConnection) -> None:
        try:
            session = await self.recognizer.open_session()
        except NoFreeSlot as e:
            await ws.send(encode_server(Error(str(e)), 0))
            await ws.close(1013, "no free slot")
            return
        self.connections += 1
        try:
            await ws.send(encode_server(Ready(), 0))
            reader = asyncio.create_task(self._read(ws, session))
            writer = asyncio.create_task(self._write(ws, session))
            # The reader ends when the connection closes, the writer when the session closes.
            done, pending = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.debug("connection ended: %r", t.exception())
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        finally:
            self.connections -= 1
            await session.close()

    async def _read(self, ws: ServerConnection, session) -> None:
        async for raw in ws:
            try:
                msg = decode_client(raw)
            except ProtocolError as e:
                self.protocol_errors += 1
                await ws.send(encode_server(Error(str(e)), session.buffered_samples))
                continue
            try:
                if isinstance(msg, Audio):
                    await session.feed(msg.pcm)  # waits while the buffer is full: TCP backpressure
                elif isinstance(msg, Marker):
                    await session.mark(msg.id)
                elif isinstance(msg, Flush):
                    await session.flush()
                elif isinstance(msg, Init):
                    pass
            except SessionClosed:
                return

    async def _write(self, ws: ServerConnection, session) -> None:
        while True:
            msgs = await session.messages()
            if not msgs:  # closed (evicted or stopped) and drained
                await ws.close(1000, getattr(session, "closed_reason", None) or "session closed")
                return
            for m in msgs:
                await ws.send(encode_server(m, session.buffered_samples))

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0):
        """Async context: yields the bound port."""
        async with serve(self.handle, host, port, process_request=self.process_request,
                         max_size=MAX_FRAME_BYTES, max_queue=INCOMING_QUEUE, compression=None) as srv:
            yield srv.sockets[0].getsockname()[1]


DEFAULT_MODEL = "whisper-tiny.en"  # a newcomer who starts the server gets words, not noise
TINY_RANDOM = "tiny-random"  # the random Kyutai engine, for plumbing and load tests only


def build_recognizer(args) -> Recognizer:
    """The recognizer for --model with the CLI's settings: the embedded Whisper (the default),
    the tiny random Kyutai engine (`tiny-random`), or a Kyutai STT checkpoint (hub id or dir)."""
    from asr.whisper import EMBEDDED

    model = args.model or DEFAULT_MODEL
    if model in EMBEDDED:
        from asr.whisper import WhisperRecognizer
        from asr.whisper_service import WhisperService, WhisperServiceConfig

        cfg = WhisperServiceConfig(max_sessions=args.slots, buffer_seconds=args.buffer_seconds,
                                   admission_wait_s=args.admission_wait, idle_timeout_s=args.idle_timeout,
                                   max_session_s=args.max_session)
        return WhisperService(WhisperRecognizer.load(model), cfg)

    from asr.kyutai import from_pretrained, tiny_random
    from asr.scheduler import EngineScheduler, SchedulerConfig

    if model == TINY_RANDOM:
        loaded = tiny_random(args.slots, seed=0, device=args.device, compile=args.compile,
                             tune_convs=args.tune_convs)
    else:
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        loaded = from_pretrained(model, args.slots, device=args.device, dtype=dtype, compile=args.compile,
                                 tune_convs=args.tune_convs)
    cfg = SchedulerConfig(buffer_seconds=args.buffer_seconds, admission_wait_s=args.admission_wait,
                          idle_timeout_s=args.idle_timeout, max_session_s=args.max_session)
    return EngineScheduler(loaded, cfg)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="duplex asr-serve", description=__doc__.split("\n\n")[0],
        epilog="With no --model it serves the embedded Whisper tiny.en (offline; segmented by Silero VAD, "
               "so words come at utterance ends). Kyutai STT: --model kyutai/stt-1b-en_fr (downloads from "
               "the Hugging Face hub: needs internet once) or --model DIR (a saved checkpoint, offline). "
               "--model tiny-random, or a directory written by `python -m asr.kyutai --save-tiny DIR`, "
               "serves random weights: the plumbing works, the words are noise. Protocol: asr/PROTOCOL.md.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"{DEFAULT_MODEL} (default): the embedded Whisper recognizer (offline, a real speech "
                        "model); or a Kyutai STT checkpoint for the batched engine: a hub id (needs internet), "
                        "e.g. kyutai/stt-1b-en_fr, or a local transformers directory; or "
                        f"{TINY_RANDOM}: the Kyutai engine with tiny RANDOM weights (not a speech model)")
    p.add_argument("--slots", type=int, default=8, help="batch size B: concurrent streams")
    p.add_argument("--device", default="cpu", help="torch device for the Kyutai engine (Whisper runs on CPU)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16",
                   help="LM dtype for a Kyutai --model")
    p.add_argument("--compile", action="store_true", help="torch.compile the engine step")
    p.add_argument("--no-tune-convs", dest="tune_convs", action="store_false",
                   help="on CPU, keep oneDNN for every Mimi conv instead of timing it against torch's native "
                        "kernel, im2col-matmul and the SEANet C kernel per layer at start-up")
    p.add_argument("--api-key", action="append", default=None,
                   help="accepted kyutai-api-key (repeatable; default: public_token)")
    p.add_argument("--no-auth", action="store_true", help="accept clients without a key")
    p.add_argument("--buffer-seconds", type=float, default=10.0, help="per-stream input buffer cap")
    p.add_argument("--admission-wait", type=float, default=0.0,
                   help="seconds a new client may wait for a free slot (0: refuse at once)")
    p.add_argument("--idle-timeout", type=float, default=120.0)
    p.add_argument("--max-session", type=float, default=4 * 3600.0)
    return p.parse_args(argv)


async def serve_forever(args) -> None:
    recognizer = build_recognizer(args)
    keys = None if args.no_auth else tuple(args.api_key or DEFAULT_API_KEYS)
    server = AsrServer(recognizer, keys)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    start = getattr(recognizer, "start", None)
    if start:
        await start()
    try:
        async with server.serving(args.host, args.port) as port:
            label = recognizer.name
            print(f"asr-serve: {label} on ws://{args.host}:{port}{PATH} ({args.slots} slots)", flush=True)
            await stop.wait()
    finally:
        stop_fn = getattr(recognizer, "stop", None)
        if stop_fn:
            await stop_fn()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve_forever(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
