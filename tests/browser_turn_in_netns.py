"""The page over a TURN relay in real Chromium, inside a network namespace that holds nothing but
`lo` (`unshare -rn python tests/browser_turn_in_netns.py WAV TMP_DIR OUT_JSON`): coturn,
`duplex serve`'s Server (the test doubles for models) with a TURN secret, and Chromium opening
the page with `?ice=relay`, so that its only candidates are relays on coturn. Writes the page's
log, the candidate pair Chromium selected (getStats) and coturn's relay counts to OUT_JSON."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import wait_until
from test_browser_e2e import launch_with_file_mic
from test_serving import serving
from test_webrtc_turn import SECRET, coturn

SELECTED_PAIR = """async () => {
  const stats = await pc.getStats(), byId = new Map();
  stats.forEach((s) => byId.set(s.id, s));
  for (const s of byId.values()) {
    if (s.type !== "transport" || !s.selectedCandidatePairId) continue;
    const pair = byId.get(s.selectedCandidatePairId);
    const local = byId.get(pair.localCandidateId), remote = byId.get(pair.remoteCandidateId);
    return { local: [local.address, local.port, local.candidateType],
             remote: [remote.address, remote.port, remote.candidateType],
             bytesReceived: pair.bytesReceived, bytesSent: pair.bytesSent };
  }
  return null;
}"""


def run_page(url: str, wav: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch_with_file_mic(pw, wav)
        page = browser.new_page()
        page.goto(url + "/?autostart=1&aec=0&transport=webrtc&ice=relay")
        # the reply has played: the page reported its start (a played mark); at most 60 s
        page.wait_for_function("window.duplexLog.some(e => e.type === 'player_started')"
                               " || window.duplexLog.some(e => e.type === 'webrtc_failed')", timeout=60_000)
        out = {"log": page.evaluate("window.duplexLog"), "pair": page.evaluate(SELECTED_PAIR)}
        page.evaluate("closeWebRTC()")  # Chromium releases its allocation: coturn logs its counts
        browser.close()
    return out


async def main(wav: str, tmp: str, out: str) -> int:
    with coturn(Path(tmp)) as turn:
        url = f"turn:127.0.0.1:{turn.port}?transport=udp"
        async with serving(ice_hosts=["127.0.0.1"], ice_servers=[url], turn_secret=SECRET) as s:
            result = await asyncio.to_thread(run_page, f"http://127.0.0.1:{s.port}", wav)
        wait_until(lambda: len(turn.lines("peer usage: ")) >= len(turn.lines("ALLOCATE processed, success")), 15)
        result["relays"] = sorted(turn.relay_addresses())
        result["peer_packets"] = [int(re.search(r"rp=(\d+)", line)[1]) for line in turn.lines("peer usage: ")]
        result["allocations"] = len(turn.lines("ALLOCATE processed, success"))
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # a new namespace's lo is down
    sys.exit(asyncio.run(main(*sys.argv[1:4])))
