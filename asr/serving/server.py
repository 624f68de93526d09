"""`duplex asr-serve`: a WebSocket server wire-compatible with Kyutai moshi-server's ASR endpoint.

Path `/api/asr-streaming`, msgpack frames (asr/PROTOCOL.md), `kyutai-api-key` header (or the
`auth_id` query parameter, as moshi-server also accepts). It serves any `Recognizer`
(asr.engine.scheduler): by default the embedded Whisper recognizer (whisper-tiny.en, a real speech
model that works offline), or the batched Kyutai engine with `--model`: a Kyutai STT checkpoint
(hub id, needs internet, or a local directory) or `tiny-random` (random weights, NOT a speech
model: for trying the plumbing).

Capacity, on the same port (plain HTTP GETs, answered before any WebSocket upgrade):
- `GET /healthz`: 200 while the process runs;
- `GET /readyz`: 200 while a slot is free, 503 with the reason when every slot is busy or the
  server is draining (a Kubernetes readiness probe takes a full replica out of its Service, so
  a headless Service's DNS names only replicas with room);
- `GET /metrics`: Prometheus text (prometheus-client, a registry of its own): slots total and
  free, streams active and by result, audio and compute seconds, the real-time factor, and the
  engine's step time histogram (the batched Kyutai engine; the Whisper service has no steps).
Drain (SIGTERM or SIGINT): new streams are refused at once (HTTP 503 on the upgrade, `/readyz`
503), live streams go on up to `--drain-timeout`, then what is left is closed (1001) and the
process exits 0. A second signal skips the wait.

Backpressure: the reader awaits `session.feed`, which waits while the session's input buffer
is full; meanwhile nothing more is read from that socket and websockets' small incoming queue
fills, so the server stops reading from TCP and the client's sends block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import signal
import ssl as _ssl
import time
from collections import deque
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Response

from asr.moshi_protocol import (
    Audio,
    BadMessage,
    Error,
    Flush,
    Init,
    Marker,
    Ready,
    decode_client,
    encode_server,
)
from asr.engine.scheduler import NoFreeSlot, Recognizer, SessionClosed

PATH = "/api/asr-streaming"
DEFAULT_API_KEYS = ("public_token",)  # moshi-server's well-known key: on loopback only
KEY_ENV = "DUPLEX_ASR_API_KEY"  # the key(s), comma-separated, kept out of argv (ps)
# Incoming frames larger than this close the connection (1009) before we can parse them; the
# largest valid Audio message (MAX_PCM_SAMPLES float64) is about 2.2 MB.
MAX_FRAME_BYTES = 4 * 2**20
INCOMING_QUEUE = 2  # websockets' per-connection queue of received frames: keep it small

log = logging.getLogger("duplex.asr.server")

STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.4, 1.0)
RTF_WINDOW_S = 30.0  # the real-time factor gauge averages over this much recent work


def _text(status: HTTPStatus, text: str, content_type: str = "text/plain; charset=utf-8") -> Response:
    body = text.encode()
    return Response(status.value, status.phrase, Headers([("Content-Type", content_type),
                                                          ("Content-Length", str(len(body))),
                                                          ("Cache-Control", "no-store")]), body)


class AsrMetrics:
    """The server's Prometheus registry. Scraped values are read from the recognizer at scrape
    time: `slots()` and `free()` from its batch size and sessions, the engine's step times from
    `EngineScheduler.step_seconds` (steps since the last scrape), compute and audio seconds from
    its `compute_seconds`/`audio_seconds` counters (the Whisper service's, or the engine's steps:
    one step advances every live stream by one 80 ms frame)."""

    def __init__(self, server: AsrServer):
        self.server = server
        r = self.registry = CollectorRegistry()
        Gauge("duplex_asr_slots", "Streams this replica can hold (--slots)", registry=r).set_function(server.slots)
        Gauge("duplex_asr_slots_free", "Free slots now (0: /readyz is 503)", registry=r).set_function(server.free)
        Gauge("duplex_asr_streams_active", "Streams connected now", registry=r).set_function(
            lambda: server.connections)
        Gauge("duplex_asr_draining", "1 while draining (refusing new streams)", registry=r).set_function(
            lambda: int(server.draining))
        self.streams = Counter("duplex_asr_streams", "Streams by how they ended (refused: never started)",
                               ["result"], registry=r)
        for result in ("served", "refused", "failed"):
            self.streams.labels(result)
        self.protocol_errors = Counter("duplex_asr_protocol_errors", "Client messages that could not be decoded",
                                       registry=r)
        self.step = Histogram("duplex_asr_step_seconds", "Batched engine step time (one 80 ms frame of every "
                              "live stream); absent for the Whisper service", buckets=STEP_BUCKETS, registry=r)
        self.audio = Gauge("duplex_asr_audio_seconds_total", "Stream time processed: the engine's steps x 80 ms "
                           "(one step advances every live stream), Whisper's audio summed over streams",
                           registry=r)
        self.compute = Gauge("duplex_asr_compute_seconds_total", "Model compute time spent on it", registry=r)
        Gauge("duplex_asr_real_time_factor",
              f"Compute seconds per second of audio over the last {RTF_WINDOW_S:g} s of work: for the engine, "
              "per step of the whole batch (under 1: every stream is served in real time); for Whisper, per "
              "stream (its decodes are serialised: streams x factor under 1)", registry=r).set_function(self.rtf)
        self._ticks_seen = 0
        self._recent: deque[tuple[float, float, float]] = deque()  # (monotonic, compute, audio) samples

    def _read(self) -> tuple[float, float]:
        """(compute seconds, audio seconds) so far, and the engine's new steps into the histogram."""
        rec = self.server.recognizer
        steps = getattr(rec, "step_seconds", None)
        if steps is not None and hasattr(rec, "ticks"):
            new = rec.ticks - self._ticks_seen
            for dt in (list(steps)[-new:] if new > 0 else []):  # the deque keeps the last few thousand
                self.step.observe(dt)
            self._ticks_seen = rec.ticks
        return float(getattr(rec, "compute_seconds", 0.0)), float(getattr(rec, "audio_seconds", 0.0))

    def sample(self) -> None:
        now = time.monotonic()
        compute, audio = self._read()
        self.compute.set(compute)
        self.audio.set(audio)
        self._recent.append((now, compute, audio))
        while len(self._recent) > 2 and self._recent[1][0] < now - RTF_WINDOW_S:
            self._recent.popleft()

    def rtf(self) -> float:
        if len(self._recent) < 2:
            _, c, a = self._recent[-1] if self._recent else (0, 0.0, 0.0)
            return c / a if a > 0 else 0.0
        (_, c0, a0), (_, c1, a1) = self._recent[0], self._recent[-1]
        return (c1 - c0) / (a1 - a0) if a1 > a0 else 0.0

    def exposition(self) -> Response:
        self.sample()
        return _text(HTTPStatus.OK, generate_latest(self.registry).decode(), CONTENT_TYPE_LATEST)


class AsrServer:
    """Serves one Recognizer over WebSocket, with /healthz, /readyz and /metrics beside it."""

    def __init__(self, recognizer: Recognizer, api_keys: tuple[str, ...] | None = DEFAULT_API_KEYS):
        self.recognizer = recognizer
        self.api_keys = None if api_keys is None else frozenset(api_keys)
        self.connections = 0
        self.protocol_errors = 0
        self.draining = False
        self.metrics = AsrMetrics(self)

    # ---- capacity ----------------------------------------------------------------------------
    def slots(self) -> int:
        return int(getattr(self.recognizer, "batch_size", 0) or 0)

    def free(self) -> int:
        sessions = getattr(self.recognizer, "sessions", None)
        return max(0, self.slots() - len(sessions)) if sessions is not None else self.slots()

    def not_ready(self) -> str | None:
        """Why a new stream would be refused now (None: it would be served)."""
        if self.draining:
            return "draining"
        if self.free() <= 0:
            return f"no free slot: all {self.slots()} slots are busy"
        return None

    def drain(self) -> None:
        """Admit no new stream, for good (`/readyz` turns 503 at once)."""
        self.draining = True

    def process_request(self, connection: ServerConnection, request):
        url = urlsplit(request.path)
        if url.path == "/healthz":
            return _text(HTTPStatus.OK, "ok\n")
        if url.path == "/readyz":
            reason = self.not_ready()
            return _text(HTTPStatus.OK, "ready\n") if reason is None else _text(
                HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}\n")
        if url.path == "/metrics":
            return self.metrics.exposition()
        if url.path != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"only {PATH} is served\n")
        if self.api_keys is not None:
            given = request.headers.get_all("kyutai-api-key") or parse_qs(url.query).get("auth_id") or []
            if len(given) > 1:
                return connection.respond(HTTPStatus.BAD_REQUEST, "give the key once\n")
            if not given or not key_accepted(given[0], self.api_keys):
                return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong kyutai-api-key\n")
        if self.draining:  # full is told in the protocol (moshi's Error), as moshi-server does
            self.metrics.streams.labels("refused").inc()
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: draining\n")
        return None

    async def handle(self, ws: ServerConnection) -> None:
        try:
            if self.draining:
                raise NoFreeSlot("server draining")
            session = await self.recognizer.open_session()
        except NoFreeSlot as e:
            self.metrics.streams.labels("refused").inc()
            await ws.send(encode_server(Error(str(e)), 0))
            await ws.close(1013, "no free slot")
            return
        self.connections += 1
        result = "served"
        try:
            await ws.send(encode_server(Ready(), 0))
            reader = asyncio.create_task(self._read(ws, session))
            writer = asyncio.create_task(self._write(ws, session))
            # The reader ends when the connection closes, the writer when the session closes.
            done, pending = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.debug("connection ended: %r", t.exception())
            if getattr(session, "closed_reason", None) and "failed" in (session.closed_reason or ""):
                result = "failed"
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        except BaseException:
            result = "failed"
            raise
        finally:
            self.connections -= 1
            self.metrics.streams.labels(result).inc()
            await session.close()

    async def _read(self, ws: ServerConnection, session) -> None:
        async for raw in ws:
            try:
                msg = decode_client(raw)
            except BadMessage as e:
                self.protocol_errors += 1
                self.metrics.protocol_errors.inc()
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
    async def serving(self, host: str = "127.0.0.1", port: int = 0, ssl: _ssl.SSLContext | None = None):
        """Async context: yields the bound port. `ssl`: serve wss:// and https://."""
        async with serve(self.handle, host, port, process_request=self.process_request,
                         max_size=MAX_FRAME_BYTES, max_queue=INCOMING_QUEUE, compression=None, ssl=ssl) as srv:
            yield srv.sockets[0].getsockname()[1]


def tls_context(certfile: str | None, keyfile: str | None = None) -> _ssl.SSLContext | None:
    """The server's TLS context for --certfile/--keyfile, or None (plain ws://)."""
    if certfile is None:
        return None
    ctx = _ssl.create_default_context(_ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def key_accepted(given: str, keys: frozenset[str]) -> bool:
    """Constant time per key, and every key tried: the time taken says nothing of how much of a
    wrong key was right, nor which key matched."""
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_keys(args, environ=os.environ) -> tuple[str, ...] | None:
    """The accepted keys: --api-key, --api-key-file (one a line) and $DUPLEX_ASR_API_KEY
    together; None with --no-auth. With none given the well-known default is taken on loopback
    only: SystemExit off it."""
    if args.no_auth:
        return None
    keys = list(args.api_key or [])
    for path in args.api_key_file or []:
        try:
            with open(path) as f:
                keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
        except OSError as exc:
            raise SystemExit(f"asr-serve: --api-key-file: {exc}") from None
    keys += [k.strip() for k in environ.get(KEY_ENV, "").split(",") if k.strip()]
    if keys:
        return tuple(keys)
    if not _loopback(args.host):
        raise SystemExit(f"asr-serve: refusing to serve on {args.host} with the well-known default key "
                         f"{DEFAULT_API_KEYS[0]!r}: give --api-key-file FILE or ${KEY_ENV} (or --no-auth)")
    return DEFAULT_API_KEYS


DEFAULT_MODEL = "whisper-tiny.en"  # a newcomer who starts the server gets words, not noise
TINY_RANDOM = "tiny-random"  # the random Kyutai engine, for plumbing and load tests only


def build_recognizer(args) -> Recognizer:
    """The recognizer for --model with the CLI's settings: the embedded Whisper (the default),
    the tiny random Kyutai engine (`tiny-random`), or a Kyutai STT checkpoint (hub id or dir)."""
    from asr.whisper import EMBEDDED

    model = args.model or DEFAULT_MODEL
    if model in EMBEDDED:
        from asr.whisper import WhisperRecognizer
        from asr.serving.whisper_service import WhisperService, WhisperServiceConfig

        cfg = WhisperServiceConfig(max_sessions=args.slots, buffer_seconds=args.buffer_seconds,
                                   admission_wait_s=args.admission_wait, idle_timeout_s=args.idle_timeout,
                                   max_session_s=args.max_session)
        return WhisperService(WhisperRecognizer.load(model), cfg)

    from asr.engine.kyutai import from_pretrained, tiny_random
    from asr.engine.scheduler import EngineScheduler, SchedulerConfig

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
               "--model tiny-random, or a directory written by `python -m asr.engine.kyutai --save-tiny DIR`, "
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
                   help="accepted kyutai-api-key (repeatable; visible in ps: prefer --api-key-file or "
                        f"${KEY_ENV}). Default: public_token, on a loopback --host only")
    p.add_argument("--api-key-file", action="append", default=None, metavar="FILE",
                   help="accepted keys, one a line (repeatable)")
    p.add_argument("--no-auth", action="store_true", help="accept clients without a key")
    p.add_argument("--certfile", help="serve wss:// (and https:// probes) with this PEM certificate (chain); "
                                      "the agents then use --asr wss://HOST:PORT and trust its issuer "
                                      "(SSL_CERT_FILE for a private one)")
    p.add_argument("--keyfile", help="the certificate's private key (PEM), if not in --certfile")
    p.add_argument("--buffer-seconds", type=float, default=10.0, help="per-stream input buffer cap")
    p.add_argument("--admission-wait", type=float, default=0.0,
                   help="seconds a new client may wait for a free slot (0: refuse at once)")
    p.add_argument("--idle-timeout", type=float, default=120.0)
    p.add_argument("--max-session", type=float, default=4 * 3600.0)
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: seconds live streams may go on before they are closed (new ones "
                        "are refused at once; a second signal skips the wait)")
    return p.parse_args(argv)


async def serve_forever(args) -> None:
    keys = api_keys(args)  # before the model loads: a refusal costs nothing
    tls_context(args.certfile, args.keyfile)  # a bad certificate, too
    recognizer = build_recognizer(args)
    server = AsrServer(recognizer, keys)
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            hurry.set()
        stop.set()
        server.drain()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    start = getattr(recognizer, "start", None)
    if start:
        await start()
    try:
        async with server.serving(args.host, args.port, ssl=tls_context(args.certfile, args.keyfile)) as port:
            label = recognizer.name
            scheme = "wss" if args.certfile else "ws"
            print(f"asr-serve: {label} on {scheme}://{args.host}:{port}{PATH} ({args.slots} slots)", flush=True)
            await stop.wait()
            live = server.connections
            log.info("draining: %d live stream(s), waiting up to %.0f s", live, args.drain_timeout)
            deadline = time.monotonic() + args.drain_timeout
            while server.connections and time.monotonic() < deadline and not hurry.is_set():
                await asyncio.sleep(0.05)
            if server.connections:
                log.warning("draining: closing %d stream(s) still live", server.connections)
        # leaving `serving` closes what is left (1001 going away) and waits for its handlers
        log.info("drained")
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
