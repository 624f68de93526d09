"""The WebRTC run of tests/test_browser_e2e.py, inside a network namespace that holds nothing but
`lo` (run it as `unshare -rn python tests/browser_in_netns.py WAV SECONDS TRACE_DIR OUT_JSON`):
`duplex serve --ice-host 127.0.0.1` and Chromium both live there, so every ICE candidate and
check is on loopback, whatever Chromium gathers. Writes the page's log to OUT_JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import duplex_serve
from test_browser_e2e import run_page


def main(wav: str, seconds: str, trace_dir: str, out: str) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # a new namespace's lo is down
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing outside is reachable from here
    with duplex_serve("--llm", "smollm2-135m", "--trace-dir", trace_dir, "--ice-host", "127.0.0.1") as port:
        log = run_page(f"http://127.0.0.1:{port}", Path(wav), float(seconds), "webrtc")
    Path(out).write_text(json.dumps(log))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
