"""`duplex serve` with a memory probe, for soaks: `python scripts/serve_memory_probe.py LOG [serve args]`.

On SIGUSR1 it appends to LOG the process's RSS, the change since the last probe in RSS by
mapping (/proc/self/smaps: the heap, anonymous maps, each library) and in the cyclic collector's
objects by type (frozen ones excluded). Run `duplex bench soak` against it in stages and send a
SIGUSR1 after each: a Python leak shows as types that grow, a native one as mappings that do.
"""
from __future__ import annotations

import collections
import gc
import signal
import sys
import time

_last: dict = {}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) / 1024


def _rss_by_mapping() -> collections.Counter:
    kib: collections.Counter = collections.Counter()
    name = "[anon]"
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                kib[name] += int(parts[1])
    return kib


def _probe(log_path: str) -> None:
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    maps = _rss_by_mapping()
    with open(log_path, "a") as log:
        log.write(f"{time.strftime('%T')} rss {_rss_mib():.1f} MiB, objects {sum(types.values())}\n")
        if _last:
            grew = types - _last["types"]
            log.write("  types: " + ", ".join(f"{k} +{v}" for k, v in grew.most_common(15)) + "\n")
            delta = {k: maps[k] - _last["maps"].get(k, 0) for k in set(maps) | set(_last["maps"])}
            top = sorted((kv for kv in delta.items() if kv[1]), key=lambda kv: -abs(kv[1]))[:8]
            log.write("  KiB by mapping: " + ", ".join(f"{k.rsplit('/', 1)[-1]} {v:+d}" for k, v in top) + "\n")
    _last.update(types=types, maps=maps)


def main() -> int:
    log_path, args = sys.argv[1], sys.argv[2:]
    signal.signal(signal.SIGUSR1, lambda *_: _probe(log_path))
    from agent.serving.cli import main as duplex

    return duplex(["serve", *args])


if __name__ == "__main__":
    sys.exit(main())
