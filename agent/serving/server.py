"""`duplex serve` as an object: the browser page, the phone media streams and AudioSocket, one
admission for all of them (hard cap, measured load, drain), /healthz, /readyz and /metrics,
and a graceful drain.

Drain (`drain()`, on SIGTERM or SIGINT): admit nothing more (`/readyz` turns 503 at once),
let live conversations finish for up to `drain_timeout_s`, then end what is left cleanly (a
phone hears a goodbye, a page is told why), and return. A second `drain()` skips the wait.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import ipaddress
import itertools
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from agent.conversation.config import Models, SessionConfig
from agent.serving.holding import HeldTransport, Holding, HoldingPolicy
from agent.serving.load import LoadMonitor, LoadPolicy, QueuedLLM
from agent.serving.metrics import ServerMetrics
from agent.tracing.profiling import run_traced
from agent.serving.public_errors import PublicErrorsTransport
from agent.conversation.reply import Playout
from agent.conversation.session import Session
from agent.tracing.trace import Tracer
from agent.tracing.export import write_trace
from agent.workers import cancel_and_wait, run_in
from transport.admission import Admission
from transport.base import AudioIn, Transport
from transport.limits import SourceLimits, SourcePolicy
from transport.telephony.audiosocket_server import LOOPBACK, networks, run_audiosocket_server
from transport.telephony.media_streams import DIALECTS, MediaStreamCall
from transport.telephony.media_streams_ws import MediaStreamTransport
from transport.telephony.signatures import PHONE_ROUTES, carrier_guards
from transport.telephony.vonage import VonageCall
from transport.web.access import BrowserAccess
from transport.web.server import Guard, run_ops_server, run_server
from transport.webrtc.ice_servers import CONFIG_PATH, DEFAULT_TTL_S, IceServers
from transport.webrtc.signalling import OFFER_PATH, WebRTCOffers, WebRTCOptions, config_routes, offer_routes
from tts.base import AudioChunk, known_text

log = logging.getLogger("duplex.serve")

BUSY = "Sorry, all our lines are busy right now. Please call again in a few minutes."
GOODBYE = "Sorry, I have to end our call now. Goodbye."

# A transport of your own (docs/extending.md, "A transport"): `listen(conversation, admission)` accepts
# far ends until cancelled, and for each one admitted runs `await conversation(transport)`.
Listener = Callable[[Callable[[Transport], Awaitable[None]], Admission], Awaitable[None]]


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    audiosocket_port: int | None = None
    max_sessions: int = 16
    load: LoadPolicy = field(default_factory=LoadPolicy)
    drain_timeout_s: float = 30.0
    trace_dir: str | None = None
    auth_token: str | None = None
    allowed_origins: list[str] = field(default_factory=list)
    # host names (Host header) served besides loopback ones, IP literals and `host`: DNS rebinding
    allowed_hosts: list[str] = field(default_factory=list)
    public_url: str | None = None  # the wss:// URL carriers were given: its host is served too
    # serve off loopback without --auth-token: every route open to whoever reaches the port
    insecure_no_auth: bool = False
    audiosocket_allow: list[str] = field(default_factory=lambda: list(LOOPBACK))  # source networks
    holding: HoldingPolicy = field(default_factory=HoldingPolicy)  # idle timeout, longest call
    sources: SourcePolicy = field(default_factory=SourcePolicy)  # per-address limits
    # /metrics and /readyz's reasons on this port only (not through a proxy in front of `port`)
    metrics_port: int | None = None
    guards: dict[str, Guard] = field(default_factory=dict)  # phone routes: the carriers' signatures
    certfile: str | None = None
    keyfile: str | None = None
    listeners: dict[str, Listener] = field(default_factory=dict)  # name -> a transport of your own
    ice_hosts: list[str] = field(default_factory=list)  # WebRTC: the only host candidates gathered
    ice_servers: list[str] = field(default_factory=list)  # WebRTC: STUN/TURN URLs
    turn_secret: str | None = None  # WebRTC: coturn's static-auth-secret, for turn: URLs without credentials
    turn_ttl_s: float = DEFAULT_TTL_S  # how long those credentials last

    def webrtc_options(self) -> WebRTCOptions:
        """ValueError on a bad --ice-host, --ice-server or TURN setting."""
        return WebRTCOptions(tuple(self.ice_hosts),
                             IceServers(tuple(self.ice_servers), self.turn_secret, self.turn_ttl_s))

    def exposure_error(self) -> str | None:
        """Why this configuration must not start: listening beyond loopback with no token and
        no explicit opt-out. ValueError for a bad --audiosocket-allow or --trusted-proxy."""
        networks(self.audiosocket_allow)
        SourceLimits(self.sources)  # a bad --trusted-proxy stops here too
        if is_loopback(self.host) or self.auth_token or self.insecure_no_auth:
            return None
        return (f"refusing to listen on {self.host or 'every address'} without --auth-token: anyone who "
                "reaches the port could hold conversations. Set --auth-token (or $DUPLEX_AUTH_TOKEN), or "
                "pass --insecure-no-auth to serve openly anyway")

    def phone_guards(self) -> dict[str, Guard]:
        """The carriers' signatures given, and the token on every phone route without one."""
        return {**carrier_guards(auth_token=self.auth_token), **self.guards}

    def served_hosts(self) -> list[str]:
        public = urlsplit(self.public_url).hostname if self.public_url else None
        return [h for h in (self.host, *self.allowed_hosts, public) if h]

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.certfile is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx


def is_loopback(host: str) -> bool:
    """Whether `--host` listens on the loopback interface only ('' and 0.0.0.0 are every address)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def route_guards(cfg: ServeConfig, guards: dict[str, Guard]) -> list[tuple[str, bool]]:
    """What guards each route, for the start-up log: (line, open to anyone who reaches it)."""
    token = "token + Origin" if cfg.auth_token else "Origin only, NO TOKEN (any non-browser client may open it)"
    lines = [(f"/ws, {OFFER_PATH}, {CONFIG_PATH}: {token}", not cfg.auth_token),
             (f"hosts served: IP addresses, loopback names, {', '.join(cfg.served_hosts()) or '-'}", False)]
    names = {"TwilioSignature": "Twilio's signature", "PlivoSignature": "Plivo's signature",
             "VonageSignature": "Vonage's signed JWT", "TokenRequired": "token"}
    for route in PHONE_ROUTES:
        guard = guards.get(route)
        what = names.get(type(guard).__name__, "a guard of your own") if guard is not None else "OPEN"
        lines.append((f"{route}: {what}; browser pages refused", guard is None))
    if cfg.audiosocket_port is not None:
        lines.append((f"AudioSocket :{cfg.audiosocket_port}: sources {', '.join(cfg.audiosocket_allow)}, "
                      "no credentials", False))
    if cfg.metrics_port is None:
        lines.append(("/healthz, /readyz (with its reasons), /metrics: public", False))
    else:
        lines.append((f"/healthz, /readyz: public, status only; /metrics and the reasons on :{cfg.metrics_port}",
                      False))
    return lines


def _kind(transport: Transport) -> str:
    """What names a conversation in logs, traces and metrics: its transport's `kind`."""
    return getattr(transport, "kind", None) or "web"


class Server:
    def __init__(self, models: Models, session_config: SessionConfig, config: ServeConfig | None = None,
                 monitor: LoadMonitor | None = None, engine=None, agent=None):
        self.agent = agent  # agent.Agent, served to every conversation (None: the default one)
        self.llm = QueuedLLM(models.llm)
        self.models, self.session_config = dataclasses.replace(models, llm=self.llm), session_config
        self.config = config or ServeConfig()
        self.monitor = monitor or LoadMonitor(self.config.load)
        self.monitor.llm_queue = lambda: self.llm.waiting
        self.metrics = ServerMetrics(engine=engine)
        self.metrics.show_load(self.monitor)
        self.admission = Admission(self.config.max_sessions, on_refused=self.metrics.refused,
                                   load=self.monitor if self.monitor.policy.enabled else None)
        self.sessions: dict[str, tuple[Session, asyncio.Task]] = {}
        self.limits = SourceLimits(self.config.sources)
        self._ids = itertools.count()
        self._drain = asyncio.Event()
        self._hurry = asyncio.Event()  # a second signal: do not wait for conversations to end
        self._busy_audio: AudioChunk | None = None
        self.ready = asyncio.Event()
        self.port: int | None = None

    # ---- one conversation ---------------------------------------------------------------------
    async def _conversation(self, transport: Transport) -> None:
        try:
            await self._converse(transport)
        finally:  # here the session is referenced no more
            await run_in("io", release_free_memory)

    async def _converse(self, transport: Transport) -> None:
        sid = f"{_kind(transport)}{next(self._ids)}"
        tracer = Tracer(sid, capacity=1 << 17) if self.config.trace_dir else None
        async with self.metrics.conversation(sid, transport) as watched:
            holding = Holding(self.config.holding, time.monotonic())
            # errors to the caller say what, not where (the detail goes to the log)
            far_end = HeldTransport(PublicErrorsTransport(watched, sid), holding)
            session = Session(self.models, far_end, self.session_config, tracer=tracer, session_id=sid,
                              agent=self.agent)
            self.sessions[sid] = (session, asyncio.current_task())
            watchdog = asyncio.create_task(self._hold(sid, session, holding, asyncio.current_task()),
                                           name=f"{sid}-limits")
            try:
                await run_traced(session, tracer)
            finally:
                await cancel_and_wait(watchdog)
                del self.sessions[sid]
                if tracer is not None:
                    path = os.path.join(self.config.trace_dir, f"{sid}.trace.json")
                    await run_in("io", write_trace, tracer, path)

    async def _hold(self, sid: str, session: Session, holding: Holding, conversation: asyncio.Task) -> None:
        """End the conversation once it has been idle too long or has lasted too long: the page is
        told why, a phone hears a goodbye; if that cannot be said within 10 s, it is cut."""
        while (wait := holding.due(time.monotonic())) is not None:
            if (expired := holding.expired(time.monotonic())) is not None:
                log.warning("%s: ending the conversation: %s", sid, expired.message)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(10.0):
                        await session.hang_up(expired.code, expired.message, expired.spoken)
                await asyncio.sleep(5.0)  # run() returns once hang_up is done, and cancels this
                conversation.cancel()
                return
            await asyncio.sleep(min(wait, 1.0) + 0.01)

    async def _busy(self, transport: Transport) -> None:
        """A phone call that is not admitted hears why, then is closed by its route."""
        if self._busy_audio is None:
            self._busy_audio = await synthesize(self.models.tts, BUSY)
        await announce(transport, self._busy_audio)

    # ---- the process ----------------------------------------------------------------------------
    def drain(self) -> None:
        if self._drain.is_set():
            self._hurry.set()
        self._drain.set()
        self.admission.drain()

    async def run(self) -> None:
        """Serve until drained."""
        cfg = self.config
        if (error := cfg.exposure_error()) is not None:
            raise ValueError(error)
        if cfg.insecure_no_auth and not cfg.auth_token and not is_loopback(cfg.host):
            log.warning("--insecure-no-auth: serving on %s with NO TOKEN; anyone who reaches the port may "
                        "hold conversations", cfg.host or "every address")
        guards = cfg.phone_guards()
        for line, is_open in route_guards(cfg, guards):
            log.log(logging.WARNING if is_open else logging.INFO, "guard: %s", line)
        routes = {f"/{name}": (lambda ws, d=d: MediaStreamTransport(ws, MediaStreamCall(d)))
                  for name, d in DIALECTS.items()}
        routes["/vonage"] = lambda ws: MediaStreamTransport(ws, VonageCall())
        web_ready = asyncio.Event()
        offers = WebRTCOffers(self._conversation, self.admission, cfg.webrtc_options(), limits=self.limits)
        ops = {"/metrics": self.metrics.exposition}
        private_ops = cfg.metrics_port is not None
        tasks = [asyncio.create_task(run_server(
                     self._conversation, cfg.host, cfg.port, self.models.tts.sample_rate, web_ready,
                     admission=self.admission, routes=routes, http_routes={} if private_ops else ops,
                     access=BrowserAccess.of(cfg.auth_token, cfg.allowed_origins, cfg.served_hosts()),
                     guards=guards,
                     busy=self._busy, ssl=cfg.ssl_context(), post_routes=offer_routes(offers),
                     guarded_routes=config_routes(offers), limits=self.limits, probe_reasons=not private_ops),
                     name="web"),
                 asyncio.create_task(self.monitor.run(on_lag=self.metrics.loop_lag.observe), name="load")]
        if private_ops:
            tasks.append(asyncio.create_task(run_ops_server(ops, self.admission, cfg.host, cfg.metrics_port),
                                             name="metrics"))
        if cfg.audiosocket_port is not None:
            tasks.append(asyncio.create_task(run_audiosocket_server(
                self._conversation, cfg.host, cfg.audiosocket_port, admission=self.admission, busy=self._busy,
                allow=cfg.audiosocket_allow),
                name="audiosocket"))
        tasks += [asyncio.create_task(listen(self._conversation, self.admission), name=name)
                  for name, listen in cfg.listeners.items()]
        try:
            started = asyncio.create_task(web_ready.wait())
            await asyncio.wait([started, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done():
                    t.result()  # a server that could not start (port taken): its error
            self.ready.set()
            self._busy_audio = await synthesize(self.models.tts, BUSY)
            drained = asyncio.create_task(self._drain.wait())
            await asyncio.wait([drained, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done():
                    t.result()
            await self._finish_live()
        finally:
            await cancel_and_wait(*tasks)
            await offers.close()

    async def _finish_live(self) -> None:
        live = len(self.sessions)
        log.info("draining: %d live conversation(s), waiting up to %.0f s", live, self.config.drain_timeout_s)
        if not await self._until(lambda: not self.sessions, self.config.drain_timeout_s):
            log.warning("draining: ending %d conversation(s) still live", len(self.sessions))
            ending = list(self.sessions.items())
            await asyncio.gather(*(s.hang_up("server_shutdown", "the server is shutting down", GOODBYE)
                                   for _, (s, _) in ending), return_exceptions=True)
            if not await self._until(lambda: not self.sessions, 5.0):
                await cancel_and_wait(*(t for _, (_, t) in list(self.sessions.items())))
        log.info("drained")

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if self._hurry.is_set() or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


def _glibc(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _glibc("malloc_trim")
_M_ARENA_MAX, _M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -8, -3, -1  # glibc's mallopt parameters
# glibc's own limits for the thresholds it raises as large blocks are freed (64-bit)
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 64 << 20


def steady_malloc(arenas: int = 2) -> None:
    """Call before the models load, in a process that serves for hours, to hold a soak's RSS
    steady (docs/serving.md, Memory): two arenas instead of one per model thread, and the mmap
    and trim thresholds at once where glibc would raise them to only after tens of conversations
    (a step of ~30 MiB then). Not low: fixed at 128 KiB, every Whisper decode's scratch is mapped
    and faulted in anew and each decode takes 1.5-2 times as long. The user's own MALLOC_*
    settings win."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, arenas)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim) once a conversation
    has ended: glibc keeps what the models' native code frees in its per-thread arenas, and each
    conversation's differently sized buffers would leave a long-running server a little larger."""
    if _TRIM is not None:
        _TRIM(0)


async def synthesize(tts, text: str) -> AudioChunk:
    """`text` spoken by `tts`, as one chunk."""
    chunks = [c async for c in tts.stream(known_text(text))]
    rate = chunks[0].sample_rate if chunks else tts.sample_rate
    pcm = np.concatenate([c.pcm for c in chunks]) if chunks else np.zeros(0, np.int16)
    return AudioChunk(pcm, rate, text)


async def announce(transport: Transport, chunk: AudioChunk, start_timeout_s: float = 5.0) -> None:
    """Play `chunk` to a far end that is not a conversation (a refused call), once its audio
    has started (a phone stream's rate is known only then); its input is read and dropped."""
    started = asyncio.Event()

    async def read() -> None:
        while (event := await transport.receive()) is not None:
            if isinstance(event, AudioIn):
                started.set()
        started.set()  # the far end is gone

    reader = asyncio.create_task(read())
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(start_timeout_s):
                await started.wait()
            if not reader.done():
                playout = Playout(transport, lead_s=0.4, piece_s=0.1, new_id=itertools.count().__next__)
                try:
                    await playout.play(chunk)
                    await playout.wait_played()
                finally:
                    await playout.close()
    finally:
        await cancel_and_wait(reader)
