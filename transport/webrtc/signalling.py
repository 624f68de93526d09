"""`POST /webrtc/offer`: the page's SDP offer in, our answer out, and a conversation started on
the new peer connection. The request checks are Sans-I/O (`parse_offer`); `WebRTCOffers` is the
asyncio shell that negotiates, admits and runs the conversations and closes what they leave.
`GET /webrtc/config` hands the page the STUN/TURN servers (transport/webrtc/ice_servers.py)
before it offers.

Only one offer/answer exchange per conversation, no trickle ICE: the answer carries our
candidates (host ones, gathered in well under a second, and STUN/TURN ones when servers are
given), and the offer carries the peer's (the page waits for its gathering to complete).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription
from websockets.http11 import Request

from transport.admission import Admission
from transport.base import Transport
from transport.credentials import header
from transport.limits import SourceLimits, SourcePolicy
from transport.webrtc.ice import check_hosts, configuration, host_addresses
from transport.webrtc.ice_servers import CONFIG_PATH, IceServers, unique_user
from transport.webrtc.jitter import use_low_latency_audio
from transport.webrtc.transport import WebRTCTransport

log = logging.getLogger("duplex.webrtc")
OFFER_PATH = "/webrtc/offer"


class OfferError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def parse_offer(content_type: str | None, body: bytes) -> RTCSessionDescription:
    """The offer in a request, or OfferError saying what is wrong with it."""
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise OfferError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                         f"send the offer as application/json, not {content_type or 'no Content-Type'}")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise OfferError(HTTPStatus.BAD_REQUEST, f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict) or obj.get("type") != "offer" or not isinstance(obj.get("sdp"), str):
        raise OfferError(HTTPStatus.BAD_REQUEST, 'the body must be {"sdp": "...", "type": "offer"}')
    if not obj["sdp"].lstrip().startswith("v=0"):
        raise OfferError(HTTPStatus.BAD_REQUEST, "unreadable SDP: a session description starts with v=0")
    try:
        sdp = SessionDescription.parse(obj["sdp"])
    except Exception as exc:  # noqa: BLE001 - aiortc's parser raises whatever the text trips it on
        raise OfferError(HTTPStatus.BAD_REQUEST, f"unreadable SDP: {str(exc)[:200] or type(exc).__name__}") from None
    audio = [m for m in sdp.media if m.kind == "audio" and m.port != 0]
    if not audio:
        raise OfferError(HTTPStatus.BAD_REQUEST, "the offer has no audio: add the microphone track")
    if not any(c.name.lower() == "opus" for m in audio for c in m.rtp.codecs):
        raise OfferError(HTTPStatus.BAD_REQUEST, "the offer's audio has no Opus codec")
    if audio[0].direction not in (None, "sendrecv"):
        raise OfferError(HTTPStatus.BAD_REQUEST,
                         f"the audio must be sendrecv (the mic in, the reply out), not {audio[0].direction}")
    return RTCSessionDescription(obj["sdp"], "offer")


def _json(status: HTTPStatus, obj: dict) -> tuple[int, dict[str, str], bytes]:
    return status.value, {"Content-Type": "application/json"}, json.dumps(obj).encode()


@dataclass(frozen=True)
class WebRTCOptions:
    ice_hosts: tuple[str, ...] = ()  # gather only these host addresses (empty: aioice's choice)
    ice_servers: IceServers = field(default_factory=IceServers)  # STUN/TURN, checked when made
    negotiate_timeout_s: float = 8.0  # under websockets' 10 s for the whole request
    close_timeout_s: float = 5.0  # closing a peer connection no conversation took
    transport: dict = field(default_factory=dict)  # WebRTCTransport's limits

    def __post_init__(self):
        check_hosts(self.ice_hosts)


class WebRTCOffers:
    """Answers offers; runs `handler(transport)` for each admitted one until it returns, then
    closes its peer connection. `close()` ends them all (the server is stopping)."""

    def __init__(self, handler: Callable[[Transport], Awaitable[None]], admission: Admission,
                 options: WebRTCOptions | None = None, clock: Callable[[], float] | None = None,
                 limits: SourceLimits | None = None):
        self.handler, self.admission = handler, admission
        self.limits = limits or SourceLimits(SourcePolicy(max_live=0, per_minute=0))  # per caller address
        self.options = options or WebRTCOptions()
        self.clock = clock or time.time  # unix time: TURN credentials expire by it (read when made: a test's clock too)
        self.conversations: set[asyncio.Task] = set()
        self._closing: set[asyncio.Task] = set()  # peer connections of failed offers, being closed

    def config(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        """GET /webrtc/config (behind the same token and Origin checks as the offer)."""
        return _json(HTTPStatus.OK, self.options.ice_servers.page_config(self.clock(), unique_user()))

    async def answer(self, request: Request, body: bytes,
                     source: str | None = None) -> tuple[int, dict[str, str], bytes]:
        try:
            offer = parse_offer(header(request, "Content-Type"), body)
        except OfferError as exc:
            return _json(exc.status, {"error": str(exc)})
        if not self.limits.enter(source):
            return _json(HTTPStatus.TOO_MANY_REQUESTS, {"error": "too many conversations from your address"})
        if (reason := self.admission.enter()) is not None:
            self.limits.leave(source)
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not now: {reason}"})
        # from here the slot and the peer connection are ours until a conversation takes them:
        # released on every other way out, cancellation (a BaseException) included
        pc: RTCPeerConnection | None = None
        transport: WebRTCTransport | None = None
        why, owned = "cancelled", False
        try:
            # TURN credentials of its own, fresh for each offer (the page's came from /webrtc/config)
            pc = RTCPeerConnection(configuration(self.options.ice_servers.at(self.clock(), unique_user())))
            transport = WebRTCTransport(pc, **self.options.transport)
            async with asyncio.timeout(self.options.negotiate_timeout_s):  # a deadline of its own
                with host_addresses(self.options.ice_hosts):
                    await pc.setRemoteDescription(offer)
                    use_low_latency_audio(pc)  # the mic's frames go to the VAD as they come
                    pc.addTrack(transport.track)
                    await pc.setLocalDescription(await pc.createAnswer())
            local = pc.localDescription
            task = asyncio.create_task(self._run(transport, source), name="webrtc-conversation")
            self.conversations.add(task)
            task.add_done_callback(self.conversations.discard)
            owned = True  # the conversation releases them when it ends
            return _json(HTTPStatus.OK, {"sdp": local.sdp, "type": local.type})
        except TimeoutError:
            why = f"negotiation took over {self.options.negotiate_timeout_s:g} s"
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "negotiation timed out"})
        except Exception as exc:  # noqa: BLE001 - a bad offer (aiortc raises many kinds): 400, no session
            why = f"cannot answer: {str(exc)[:200] or type(exc).__name__}"
            return _json(HTTPStatus.BAD_REQUEST, {"error": f"cannot answer this offer: {str(exc)[:200]}"})
        finally:
            if not owned:
                self.admission.leave()  # at once, before anything else can be interrupted
                self.limits.leave(source)
                # a bad offer is the caller's business (info, as before); a timeout or a cancel is ours
                log.log(logging.INFO if why.startswith("cannot answer") else logging.WARNING,
                        "webrtc offer: slot released, peer connection closed: %s", why)
                if pc is not None:
                    await self._close_unowned(pc, transport)

    async def _close_unowned(self, pc: RTCPeerConnection, transport: WebRTCTransport | None) -> None:
        """Close a peer connection no conversation took, within a bound, even if the request
        that made it is being cancelled (the close goes on in a task of its own)."""
        async def close() -> None:
            async with asyncio.timeout(self.options.close_timeout_s):
                await (transport.close() if transport is not None else pc.close())

        closing = asyncio.create_task(close(), name="webrtc-close-unowned")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        closing.add_done_callback(_log_close_failure)
        await asyncio.shield(closing)

    async def _run(self, transport: WebRTCTransport, source: str | None = None) -> None:
        try:
            await self.handler(transport)
        except Exception:
            log.exception("webrtc session failed")
        finally:
            try:
                await transport.close()
            finally:
                self.admission.leave()
                self.limits.leave(source)

    async def close(self) -> None:
        for task in list(self.conversations):
            task.cancel()
        await asyncio.gather(*self.conversations, *self._closing, return_exceptions=True)


def _log_close_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("webrtc offer: closing an unanswered peer connection failed: %r", exc)


def offer_routes(offers: WebRTCOffers) -> dict[str, Callable]:
    return {OFFER_PATH: offers.answer}


def config_routes(offers: WebRTCOffers) -> dict[str, Callable]:
    return {CONFIG_PATH: offers.config}


__all__ = ["CONFIG_PATH", "OFFER_PATH", "OfferError", "WebRTCOffers", "WebRTCOptions", "config_routes",
           "offer_routes", "parse_offer"]

