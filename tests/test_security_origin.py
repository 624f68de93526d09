"""A web page may not open a phone route (issue 40): carriers send no Origin header and browsers
always do, so `/twilio`, `/telnyx`, `/plivo`, `/exotel` and `/vonage` refuse an upgrade that
carries one (403) unless its origin is listed with --allowed-origin. Real sockets against
`duplex serve`'s Server on the test doubles, and headless Chromium for a cross-site page."""
from __future__ import annotations

import contextlib
import http.server
import shutil
import threading

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from test_serving import serving

PHONE_ROUTES = ("/twilio", "/telnyx", "/plivo", "/exotel", "/vonage")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


async def upgrade_status(url: str, **kw) -> int | None:
    """The status an upgrade is refused with, or None when the WebSocket opens."""
    try:
        async with connect(url, open_timeout=10, **kw):
            return None
    except InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.usefixtures("virtual_clock")  # the server and its clients on this loop
async def test_a_phone_route_refuses_an_upgrade_that_carries_an_origin():
    async with serving() as s:
        for route in PHONE_ROUTES:
            assert await upgrade_status(s.url(route), origin="http://evil.example") == 403, route
            # not even the server's own page, nor one on localhost: no page of ours opens them
            assert await upgrade_status(s.url(route), origin=f"http://127.0.0.1:{s.port}") == 403, route
            assert await upgrade_status(s.url(route)) is None, route  # a carrier: no Origin
    async with serving(origins=["https://ops.example"]) as s:
        assert await upgrade_status(s.url("/exotel"), origin="https://ops.example") is None
        assert await upgrade_status(s.url("/exotel"), origin="https://other.example") == 403


async def test_a_refused_phone_page_never_becomes_a_conversation():
    async with serving(max_sessions=1) as s:
        for _ in range(5):
            assert await upgrade_status(s.url("/exotel"), origin="http://evil.example") == 403
        assert s.admission.live == 0 and s.admission.admitting


PAGE = b"""<!doctype html><script>
window.tryOpen = (url) => new Promise((resolve) => {
  const ws = new WebSocket(url);
  ws.onopen = () => { ws.close(); resolve("open"); };
  ws.onerror = () => resolve("refused");
});
</script>"""


@contextlib.contextmanager
def any_host_site():
    """A page served to whatever host name the browser asks for (mapped to 127.0.0.1)."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
async def test_a_cross_site_page_in_chromium_cannot_open_exotel():
    from playwright.async_api import async_playwright

    with any_host_site() as site:
        async with serving(origins=[f"http://allowed.example:{site}"]) as s, async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                      "--host-resolver-rules=MAP evil.example 127.0.0.1, MAP allowed.example 127.0.0.1"])
            try:
                results = {}
                for name in ("evil.example", "allowed.example"):
                    page = await browser.new_page()
                    await page.goto(f"http://{name}:{site}/")
                    results[name] = await page.evaluate("(url) => window.tryOpen(url)", s.url("/exotel"))
                    await page.close()
            finally:
                await browser.close()
        # the listed origin shows the page can open the route; the other is refused
        assert results == {"allowed.example": "open", "evil.example": "refused"}
