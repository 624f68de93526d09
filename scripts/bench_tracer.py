#!/usr/bin/env python
"""Measure the tracer's cost per event, in ns (enabled vs disabled; instant, span, counter).

Usage: python scripts/bench_tracer.py [--events N] [--capacity C] [--spill]

Each figure is the best of 3 loops of N calls, minus the cost of an empty loop,
divided by N.  A "span" is one begin() + end() pair (one recorded event).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agent.tracing.trace import Tracer  # noqa: E402


def _loop_empty(tr, n):
    for i in range(n):
        pass


def _loop_instant(tr, n):
    instant = tr.instant
    for i in range(n):
        instant("llm", "token", 3, text="x")


def _loop_instant_ts(tr, n):
    instant = tr.instant
    for i in range(n):
        instant("audio_in", "frame", 3, ts_ns=i)


def _loop_span(tr, n):
    begin, end = tr.begin, tr.end
    for i in range(n):
        end(begin("asr", "step", 3))


def _loop_span_cm(tr, n):
    span = tr.span
    for i in range(n):
        with span("asr", "step", 3):
            pass


def _loop_counter(tr, n):
    counter = tr.counter
    for i in range(n):
        counter("rss_mb", 1.0)


def _best(fn, tr, n, reps=3):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn(tr, n)
        best = min(best, time.perf_counter_ns() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--capacity", type=int, default=1 << 16)
    ap.add_argument("--spill", action="store_true", help="also measure with spill to a temp file")
    a = ap.parse_args(argv)
    n = a.events
    empty = _best(_loop_empty, None, n)
    cases = [
        ("instant", _loop_instant),
        ("instant(ts_ns=)", _loop_instant_ts),
        ("span begin+end", _loop_span),
        ("span (with ...)", _loop_span_cm),
        ("counter", _loop_counter),
    ]
    configs = [("enabled", dict()), ("disabled", dict())]
    if a.spill:
        configs.append(("enabled+spill", dict(spill=True)))
    print(f"python {sys.version.split()[0]}, {n:,} events per loop, capacity {a.capacity:,}")
    print(f"{'case':<18}" + "".join(f"{c:>16}" for c, _ in configs) + "   (ns/event)")
    tmp = tempfile.TemporaryDirectory()
    rows = {}
    for label, fn in cases:
        cells = []
        for cname, opt in configs:
            spill = os.path.join(tmp.name, f"{label}.jsonl") if opt.get("spill") else None
            tr = Tracer("bench", capacity=a.capacity, spill_path=spill)
            tr.enabled = cname != "disabled"
            ns = max(0.0, (_best(fn, tr, n) - empty) / n)
            tr.close()
            cells.append(ns)
            rows[(label, cname)] = ns
        print(f"{label:<18}" + "".join(f"{c:>16.0f}" for c in cells))
    worst = max(v for (l, c), v in rows.items() if c == "enabled")
    print(f"worst enabled case: {worst:.0f} ns/event (target < 2000)")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
