"""Importing the product changes nothing: every module of agent, asr, llm, tts and transport,
imported in a fresh interpreter, leaves the environment (OpenMP's settings are the entry points'
to make: agent.conversation.models.configure_openmp), sys.path, the root logger, the signal
handlers and the libraries it wraps (aioice) as they were, and starts no thread."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import importlib, json, logging, os, signal, sys, threading
from pathlib import Path

import aioice.ice


def state():
    return {"environ": dict(os.environ), "path": list(sys.path),
            "log_handlers": [repr(h) for h in logging.root.handlers], "log_level": logging.root.level,
            "signals": [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
            "aioice": repr(aioice.ice.get_host_addresses),
            "threads": sorted(t.name for t in threading.enumerate())}


before = state()
for top in ("agent", "asr", "llm", "tts", "transport"):
    for p in sorted(Path(top).rglob("*.py")):
        importlib.import_module(".".join(p.with_suffix("").parts).removesuffix(".__init__"))
after = state()
print(json.dumps({k: [before[k], after[k]] for k in before if before[k] != after[k]}))
"""


def test_importing_every_product_module_changes_nothing():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    changed = json.loads(out.stdout.strip().splitlines()[-1])
    if "environ" in changed:
        before, after = changed["environ"]
        changed["environ"] = {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                              if before.get(k) != after.get(k)}
    assert not changed, f"importing the product changed: {changed}"
