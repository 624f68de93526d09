"""/metrics and /readyz's reasons can be kept off the public port (issue 40): with --metrics-port
they are served there only, and the main port (the one a proxy or an Ingress exposes) answers
/metrics 404 and /readyz with its status alone. Real sockets against `duplex serve`'s Server."""
from __future__ import annotations

from websockets.asyncio.client import connect

from helpers import await_until, free_port
from test_serving import get, serving


async def test_metrics_and_readiness_reasons_on_their_own_port_only():
    ops = free_port()
    async with serving(max_sessions=1, metrics_port=ops) as s:
        status, _, text = await get(ops, "/metrics")
        assert status == 200 and "duplex_sessions_active" in text
        assert (await get(s.port, "/metrics"))[0] == 404
        async with connect(s.url("/ws")):
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            public = await get(s.port, "/readyz")
            private = await get(ops, "/readyz")
        assert public[0] == 503 and public[2] == "not ready\n"
        assert private[0] == 503 and "full: 1 of 1" in private[2]
        assert (await get(ops, "/ws"))[0] == 404  # nothing else is served there


async def test_without_it_the_main_port_serves_both_as_before():
    async with serving() as s:
        assert (await get(s.port, "/metrics"))[0] == 200
        assert (await get(s.port, "/readyz"))[2] == "ready\n"
