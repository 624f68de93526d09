"""ICE settings for our peer connections: which host addresses to gather, and STUN/TURN servers.

aioice gathers every interface address except 127.0.0.1 and has no option to choose them, and
aiortc falls back to Google's STUN server when given no list. So:

- `host_addresses(hosts)` is a context in which aioice gathers exactly `hosts` (127.0.0.1
  included): a ContextVar read by a thin wrapper around `aioice.ice.get_host_addresses`, the
  one function aioice's `Connection.gather_candidates` asks (the first such context puts it in
  aioice's place; importing this module does not). Gathering runs in tasks created
  inside `setLocalDescription`, which inherit the context, so the choice holds for the one peer
  connection negotiated inside the `with` and for no other (other peers in the process keep
  aioice's default);
- `configuration(servers)` always passes an explicit server list (empty: host candidates only,
  enough on a LAN or localhost), never aiortc's default. The servers and their credentials
  come from transport/webrtc/ice_servers.py.
"""
from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from transport.webrtc.ice_servers import IceServer

_HOSTS: ContextVar[tuple[str, ...] | None] = ContextVar("duplex_ice_hosts", default=None)
_aioice_host_addresses = aioice.ice.get_host_addresses  # aioice's own: nothing here replaces it at import


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    hosts = _HOSTS.get()
    if hosts is None:
        return _aioice_host_addresses(use_ipv4, use_ipv6)
    return [h for h in hosts if (use_ipv4 if ipaddress.ip_address(h).version == 4 else use_ipv6)]


def _wrap_aioice() -> None:
    """Put `_host_addresses` in aioice's place, once, when a choice is first made (outside one it
    answers as aioice does): importing this module changes no library."""
    if aioice.ice.get_host_addresses is not _host_addresses:
        aioice.ice.get_host_addresses = _host_addresses


def check_hosts(hosts: Sequence[str]) -> tuple[str, ...]:
    """Literal IP addresses only (a name would be resolved to who knows which interface)."""
    for h in hosts:
        try:
            ipaddress.ip_address(h)
        except ValueError:
            raise ValueError(f"--ice-host needs an IP address, got {h!r}") from None
    return tuple(hosts)


@contextlib.contextmanager
def host_addresses(hosts: Sequence[str] | None) -> Iterator[None]:
    """Gather only `hosts` as host candidates for what is negotiated inside (None: aioice's choice)."""
    token = _HOSTS.set(check_hosts(hosts) if hosts else None)
    if hosts:
        _wrap_aioice()
    try:
        yield
    finally:
        _HOSTS.reset(token)


def configuration(servers: Sequence[IceServer] = (), relay_only: bool = False) -> RTCConfiguration:
    """aiortc's configuration for `servers` (it uses the first STUN and the first TURN one).
    `relay_only`: gather relay candidates only, as a browser's iceTransportPolicy "relay"."""
    return RTCConfiguration(
        iceServers=[RTCIceServer(s.url, username=s.username, credential=s.credential) for s in servers],
        iceTransportPolicy=RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL)


def selected_pairs(pc) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The (local, remote) addresses ICE nominated on each of `pc`'s transports. aiortc has no
    getter for the selected pair (getStats omits it), so this reads aioice's nominated pairs."""
    out = []
    for t in pc.getTransceivers():
        transport = t.sender.transport
        ice = transport.transport if transport is not None else None
        conn = getattr(getattr(ice, "iceGatherer", None), "_connection", None)
        for pair in getattr(conn, "_nominated", {}).values():
            out.append((pair.local_addr, pair.remote_addr))
    return out
