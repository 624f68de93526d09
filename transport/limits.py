"""Per-source limits on the routes that start conversations: at most `max_live` open at once from
one address, and new ones at most `per_minute` a minute (a token bucket that holds `burst`).
Without them one address can take every slot, or make the server refuse everyone else by
asking faster than conversations end.

Sans-I/O: addresses are strings, the clock is passed in. The state is bounded: at most
`max_sources` addresses are remembered (the least recently seen forgotten first; an address
with live conversations is counted apart and never forgotten while they last). Addresses in
`exempt` (default loopback: a reverse proxy on the same host is every caller at once) are not
limited. Behind a proxy, name it in `trusted_proxies`: a request from it is counted by the
address it says it forwards for (the right-most X-Forwarded-For entry that is not itself a
trusted proxy); a request from anywhere else by its own address, whatever it claims.
"""
from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LOOPBACK = ("127.0.0.0/8", "::1/128")
ANY = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


@dataclass(frozen=True)
class SourcePolicy:
    max_live: int = 8  # 0: no limit
    per_minute: float = 60.0  # 0: no limit
    burst: int = 20
    exempt: tuple[str, ...] = LOOPBACK
    max_sources: int = 4096
    trusted_proxies: tuple[str, ...] = ()  # networks whose X-Forwarded-For is believed


class SourceLimits:
    def __init__(self, policy: SourcePolicy | None = None, clock: Callable[[], float] | None = None):
        self.policy = policy or SourcePolicy()
        self.clock = clock or time.monotonic  # read when made: a test's clock too
        self._exempt = [ipaddress.ip_network(n, strict=False) for n in self.policy.exempt]
        self._proxies = [ipaddress.ip_network(n, strict=False) for n in self.policy.trusted_proxies]
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, when)
        self.live: dict[str, int] = {}

    def exempt(self, source: str | None) -> bool:
        return within(source, self._exempt)

    def client(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The address to count a request by: `peer`'s own, or, when `peer` is a trusted
        proxy, the right-most X-Forwarded-For entry that is not a trusted proxy."""
        if not self._proxies or not forwarded_for or not within(peer, self._proxies):
            return peer
        for hop in reversed([h.strip() for h in forwarded_for.split(",")]):
            if not within(hop, self._proxies):
                return hop if within(hop, ANY) else peer  # not an address: counted as the proxy
        return peer

    def refusal(self, source: str | None) -> str | None:
        """One request to start a conversation from `source`: why it is refused (counted against
        its rate either way), or None."""
        if source is None or self.exempt(source):
            return None
        p = self.policy
        if p.per_minute > 0:
            now = self.clock()
            tokens, then = self._buckets.pop(source, (float(p.burst), now))
            tokens = min(float(p.burst), tokens + (now - then) * p.per_minute / 60.0)
            self._buckets[source] = (tokens - 1.0 if tokens >= 1.0 else tokens, now)
            while len(self._buckets) > p.max_sources:
                self._buckets.popitem(last=False)
            if tokens < 1.0:
                return f"too many new connections from your address: at most {p.per_minute:g} a minute"
        if p.max_live > 0 and self.live.get(source, 0) >= p.max_live:
            return f"too many conversations from your address: at most {p.max_live} at once"
        return None

    def enter(self, source: str | None) -> bool:
        """A conversation from `source` opens: False (not counted) if that is one too many."""
        if source is None or self.exempt(source) or self.policy.max_live <= 0:
            return True
        if self.live.get(source, 0) >= self.policy.max_live:
            return False
        self.live[source] = self.live.get(source, 0) + 1
        return True

    def leave(self, source: str | None) -> None:
        n = self.live.get(source or "", 0)
        if n > 1:
            self.live[source] = n - 1
        elif n == 1:
            del self.live[source]


def within(address: str | None, networks: Sequence) -> bool:
    """Whether `address` is in one of `networks` (IPv4-mapped IPv6 as IPv4, a zone id dropped);
    False for anything that is not an address."""
    try:
        ip = ipaddress.ip_address((address or "").split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in networks)


def source_of(remote_address: Sequence | None) -> str | None:
    """The address in a socket's peer name, ('1.2.3.4', port) or ('::1', port, flow, scope)."""
    return str(remote_address[0]) if remote_address else None
