"""`duplex bench load` and `duplex bench soak`: conversations against a running `duplex serve`.

load: N real-time browser-protocol conversations (transport.web.client, the tests' client too),
started `--stagger-s` apart, each with one spoken question: the question, then silence as a live
microphone sends, until the reply has finished or `--seconds` are up (then up to
`--reply-timeout` more for the reply to begin, and 90 s more for it to finish). Each one ends as
  served   admitted and answered: its reply finished (bot_done and the latency event came), or was
           still being spoken at the 90 s bound (slow, noted, not dropped);
  refused  HTTP 503 before the WebSocket opened (or closed 1013 right after), with the reason;
  dropped  admitted, then closed abnormally (keepalive ping timeout included), an error event, or
           no reply begun within the timeout;
  failed   could not connect at all (refused otherwise than 503, nothing listening, ...).
Voice-to-voice of the served ones, two ways: client-side, from sending the 20 ms frame that holds
the question's last speech sample to receiving the first reply audio; and the server's own
`voice_to_voice_ms` from its latency event. From the server's /metrics before and after: event-loop
lag (mean, and the histogram's bucket bounds on p99 and the max), RSS, conversations by result.
Then one more conversation alone: does the server serve normally right after?

soak: `--conversations` sequential conversations; RSS after 1, 10, 50, 100, 200 (and the last),
its growth after the first 10, failures, voice-to-voice p50/p90.

Questions are spoken by flite at start-up (resampled to 16 kHz); without flite, the real
recordings in ../shared/speech/dev. Everything is bounded: a deadline per conversation and per run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agent.bench.latency import (
    ASR_RATE,
    DEV_CLIPS,
    QUESTIONS,
    _dev_clip,
    _dev_transcripts,
    _flite,
    _pct,
    default_dev_dir,
    speech_end_offset,
)

LEAD_S = 0.3  # silence before the question (the VAD's pre-roll)
SOAK_MARKS = (1, 10, 50, 100, 200)
MIB = 1 << 20


@dataclass
class Question:
    name: str
    text: str
    frames: list[bytes]  # 20 ms PCM16 frames at ASR_RATE, the lead silence first
    speech_end_s: float


def make_question(name: str, text: str, pcm: np.ndarray, rate: int = ASR_RATE) -> Question:
    from transport.web.client import pcm16_frames

    pcm = np.concatenate([np.zeros(int(LEAD_S * rate), np.float32), np.asarray(pcm, np.float32)])
    end = speech_end_offset(pcm, rate)
    if end is None:
        raise ValueError(f"{name}: no speech in the question")
    return Question(name, text, pcm16_frames(pcm, rate), end)


def build_questions(work_dir: Path, dev_dir: Path | None = None) -> list[Question]:
    """flite's questions (bench latency's), else the dev clips."""
    if shutil.which("flite") is not None:
        return [make_question(f"flite{i}", q, _flite(q, work_dir / f"q{i}.wav")) for i, q in enumerate(QUESTIONS)]
    dev_dir = dev_dir or default_dev_dir()
    clips = [c for c in DEV_CLIPS if (dev_dir / c).exists()]
    if not clips:
        raise RuntimeError(f"neither flite nor the dev clips in {dev_dir} are there to speak the questions")
    said = _dev_transcripts(dev_dir)
    return [make_question(c, said.get(c, ""), _dev_clip(dev_dir / c)) for c in clips]


# ---- one conversation ---------------------------------------------------------------------------
@dataclass
class Outcome:
    index: int
    question: str
    result: str = "failed"  # served | refused | dropped | failed
    reason: str = ""
    start_s: float = 0.0  # after the run's start
    client_v2v_ms: float | None = None
    server_v2v_ms: float | None = None
    heard: str = ""
    reply: str = ""
    duration_s: float = 0.0

    @property
    def admitted(self) -> bool:
        return self.result in ("served", "dropped")


def ws_url(url: str, token: str | None = None) -> str:
    """ws://HOST:PORT -> ws://HOST:PORT/ws, with ?token= when given."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else "/ws"
    query = parts.query
    if token:
        query = "&".join(q for q in (query, urllib.parse.urlencode({"token": token})) if q)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


async def one_conversation(url: str, q: Question, index: int, seconds: float, reply_timeout: float,
                           t_run: float = 0.0, finish_timeout: float = 90.0) -> Outcome:
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    from transport.web.client import converse, reply_measured

    loop = asyncio.get_running_loop()
    out = Outcome(index, q.name, start_s=round(loop.time() - t_run, 3) if t_run else 0.0)
    t = loop.time()
    try:
        async with asyncio.timeout(seconds + reply_timeout + finish_timeout + 30.0):
            c = await converse(url, q.frames, ASR_RATE, speech_end_s=q.speech_end_s, until=reply_measured,
                               reply_timeout=reply_timeout, finish_timeout=finish_timeout, pad_s=seconds,
                               ping_interval=5.0, ping_timeout=10.0)
    except InvalidStatus as e:
        status = e.response.status_code
        body = e.response.body.decode(errors="replace").strip() if e.response.body else ""
        out.result = "refused" if status == 503 else "failed"
        out.reason = f"HTTP {status}: {body}" if body else f"HTTP {status}"
        return out
    except TimeoutError:
        if loop.time() - t < seconds + reply_timeout + finish_timeout + 29.0:  # connect's open_timeout
            out.result, out.reason = "failed", "no answer to the opening handshake within 10 s"
        else:
            out.result, out.reason = "dropped", "the conversation ran past its deadline"
        return out
    except (OSError, InvalidHandshake) as e:  # nothing listening, a handshake that failed, ...
        out.result, out.reason = "failed", f"{type(e).__name__}: {e}"
        return out
    finally:
        out.duration_s = round(loop.time() - t, 3)
    finals = c.of_type("final")
    done = c.of_type("bot_done")
    out.heard = " / ".join(e.get("text", "") for e in finals)
    out.reply = " / ".join(e.get("text", "") for e in done)
    errors = c.of_type("error")
    if c.lost and not c.ready and c.close_code == 1013:
        out.result, out.reason = "refused", f"closed 1013: {c.close_reason}"
    elif errors:
        out.result = "dropped"
        out.reason = "; ".join(f"error {e.get('code')}: {e.get('message')}" for e in errors)
    elif c.done:
        out.result = "served"
        out.client_v2v_ms = None if c.voice_to_voice_ms is None else round(c.voice_to_voice_ms, 1)
        out.server_v2v_ms = c.server_voice_to_voice_ms
    elif c.lost:
        out.result = "dropped"
        out.reason = f"connection closed by the server or lost: {c.close_code} {c.close_reason}".strip()
    elif c.first_audio is not None:  # answered, but still speaking at the bound: slow, not dropped
        out.result = "served"
        out.client_v2v_ms = None if c.voice_to_voice_ms is None else round(c.voice_to_voice_ms, 1)
        out.reason = f"the reply was still playing {finish_timeout:g} s after it began (no server figure)"
    else:
        out.result = "dropped"
        out.reason = (f"no reply began within {reply_timeout:g} s after the audio ended"
                      + (f" (heard {out.heard!r})" if finals else " (no final transcript)"))
    return out


# ---- /metrics -------------------------------------------------------------------------------------
def metrics_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    scheme = "https" if parts.scheme in ("wss", "https") else "http"
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/metrics", "", ""))


def fetch_metrics(url: str, timeout: float = 10.0) -> dict[tuple[str, tuple], float] | None:
    """The server's /metrics through prometheus-client's parser: {(sample, sorted labels): value};
    None when there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(metrics_url(url), timeout=timeout) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}
    except ValueError:
        return None


async def metrics_now(url: str) -> dict | None:
    return await asyncio.to_thread(fetch_metrics, url)


def rss_mib(m: dict | None) -> float | None:
    v = (m or {}).get(("process_resident_memory_bytes", ()))
    return None if v is None else round(v / MIB, 1)


def _diff(before: dict, after: dict, name: str, labels: tuple = ()) -> float:
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def lag_between(before: dict | None, after: dict | None) -> dict | None:
    """Event-loop lag over the run from `duplex_event_loop_lag_seconds`: samples, mean, and upper
    bounds on p99 and on the max (the smallest bucket bound holding 99% / all of the samples)."""
    if not before or not after or ("duplex_event_loop_lag_seconds_count", ()) not in after:
        return None
    n = _diff(before, after, "duplex_event_loop_lag_seconds_count")
    if n <= 0:
        return {"samples": 0, "mean_ms": None, "p99_le_ms": None, "max_le_ms": None}
    total = _diff(before, after, "duplex_event_loop_lag_seconds_sum")
    buckets = sorted((float(dict(labels)["le"]), _diff(before, after, name, labels))
                     for name, labels in after if name == "duplex_event_loop_lag_seconds_bucket")

    def bound(share: float) -> float | None:
        for le, count in buckets:
            if count >= share * n - 1e-9:
                return None if le == float("inf") else round(le * 1000, 1)
        return None

    return {"samples": int(n), "mean_ms": round(total / n * 1000, 2), "p99_le_ms": bound(0.99),
            "max_le_ms": bound(1.0), "over_top_bucket": bound(1.0) is None,
            "top_bucket_ms": round(max((le for le, _ in buckets if le != float("inf")), default=0) * 1000, 1)}


def sessions_between(before: dict | None, after: dict | None) -> dict | None:
    if not before or not after:
        return None
    return {r: int(_diff(before, after, "duplex_sessions_total", (("result", r),)))
            for r in ("served", "refused", "failed")}


# ---- load ---------------------------------------------------------------------------------------
def summarize(outcomes: list[Outcome]) -> dict:
    served = [o for o in outcomes if o.result == "served"]
    client = [o.client_v2v_ms for o in served if o.client_v2v_ms is not None]
    server = [o.server_v2v_ms for o in served if o.server_v2v_ms is not None]
    return {
        "admitted": sum(o.admitted for o in outcomes), "served": len(served),
        "refused": sum(o.result == "refused" for o in outcomes),
        "dropped": sum(o.result == "dropped" for o in outcomes),
        "failed": sum(o.result == "failed" for o in outcomes),
        "client_v2v_ms": {"n": len(client), "p50": _pct(client, 50), "p90": _pct(client, 90),
                          "max": max(client) if client else None},
        "server_v2v_ms": {"n": len(server), "p50": _pct(server, 50), "p90": _pct(server, 90),
                          "max": max(server) if server else None},
    }


async def run_load(url: str, questions: list[Question], sessions: int, seconds: float,
                   stagger_s: float = 0.25, reply_timeout: float = 30.0, after: bool = True,
                   after_wait_s: float = 15.0) -> dict:
    """N conversations started `stagger_s` apart, then (with `after`) one more alone."""
    url = ws_url(url)
    loop = asyncio.get_running_loop()
    before = await metrics_now(url)
    t_run = loop.time()

    async def staggered(i: int) -> Outcome:
        await asyncio.sleep(max(0.0, t_run + i * stagger_s - loop.time()))
        return await one_conversation(url, questions[i % len(questions)], i, seconds, reply_timeout, t_run)

    outcomes = list(await asyncio.gather(*(staggered(i) for i in range(sessions))))
    wall_s = loop.time() - t_run
    end = await settled_metrics(url)
    report = {"url": url, "sessions": sessions, "seconds": seconds, "stagger_s": stagger_s,
              "reply_timeout_s": reply_timeout, "questions": [q.name for q in questions],
              "wall_s": round(wall_s, 1), **summarize(outcomes),
              "outcomes": [asdict(o) for o in outcomes],
              "metrics": end is not None,
              "lag": lag_between(before, end), "sessions_counted": sessions_between(before, end),
              "rss_mib": {"before": rss_mib(before), "after": rss_mib(end)},
              "active_after": None if end is None else end.get(("duplex_sessions_active", ()))}
    if after:
        report["after"] = asdict(await conversation_after(url, questions[0], seconds, reply_timeout, after_wait_s))
    return report


async def settled_metrics(url: str, timeout_s: float = 10.0) -> dict | None:
    """The server's /metrics once it has closed the run's conversations (a client's close reaches
    the server a little after the client is done, and only then is the conversation counted), or
    as they are after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        m = await metrics_now(url)
        if m is None or m.get(("duplex_sessions_active", ()), 0) == 0 or loop.time() > deadline:
            return m
        await asyncio.sleep(0.1)


async def conversation_after(url: str, q: Question, seconds: float, reply_timeout: float,
                             wait_s: float) -> Outcome:
    """One conversation alone, right after a run; if refused (the server still counts the run's
    load), tried again each second for up to `wait_s`; `start_s` says how long after it was served."""
    loop = asyncio.get_running_loop()
    t = loop.time()
    while True:
        o = await one_conversation(url, q, -1, seconds, reply_timeout)
        o.start_s = round(loop.time() - t - o.duration_s, 3)
        if o.result != "refused" or loop.time() - t >= wait_s:
            return o
        await asyncio.sleep(1.0)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def _v2v_line(label: str, s: dict) -> str:
    return f"{label} (n={s['n']}): p50 {_ms(s['p50'])}  p90 {_ms(s['p90'])}  max {_ms(s['max'])}"


def _lag_line(lag: dict | None) -> str:
    if lag is None:
        return "event-loop lag: n/a (no /metrics)"
    if not lag["samples"]:
        return "event-loop lag: no samples during the run"
    top = f"> {lag['top_bucket_ms']:.0f} ms" if lag["over_top_bucket"] else f"<= {lag['max_le_ms']:g} ms"
    p99 = "-" if lag["p99_le_ms"] is None else f"<= {lag['p99_le_ms']:g} ms"
    return (f"event-loop lag (server /metrics, {lag['samples']} samples during the run): "
            f"mean {lag['mean_ms']:.1f} ms  p99 {p99}  max {top}")


def _rss_line(rss: dict) -> str:
    b, a = rss["before"], rss["after"]
    if b is None or a is None:
        return "RSS (server): n/a (no /metrics)"
    return f"RSS (server): before {b:.1f} MiB  after {a:.1f} MiB  ({a - b:+.1f} MiB)"


def _outcome_line(o: dict) -> str:
    idx = "after" if o["index"] < 0 else f"#{o['index']}"
    text = o["reason"] if o["result"] != "served" else f"{o['heard']!r} -> {o['reply'][:60]!r}"
    if o["result"] == "served" and o["reason"]:
        text += f" [{o['reason']}]"
    return (f"  {idx:>5} {o['start_s']:7.2f} {o['result']:<8} {_ms(o['client_v2v_ms']):>8} "
            f"{_ms(o['server_v2v_ms']):>8}  {text}")


def print_load(r: dict, out=None) -> None:
    p = lambda *a: print(*a, file=out or sys.stdout)
    p(f"duplex bench load: {r['sessions']} conversations against {r['url']}, started {r['stagger_s']:g} s apart, "
      f"{r['seconds']:g} s of audio each (one question, then silence), {r['wall_s']} s in all")
    p(f"admitted {r['admitted']}  refused {r['refused']}  dropped {r['dropped']}  failed to connect {r['failed']}"
      f"  (served {r['served']})")
    p(_v2v_line("voice-to-voice, client (last speech frame sent -> first reply audio)", r["client_v2v_ms"]))
    p(_v2v_line("voice-to-voice, server (its latency event)", r["server_v2v_ms"]))
    reasons: dict[str, int] = {}
    for o in r["outcomes"]:
        if o["result"] in ("refused", "dropped", "failed"):
            key = f"{o['result']}: {o['reason']}"
            reasons[key] = reasons.get(key, 0) + 1
    for key, n in reasons.items():
        p(f"  {n} x {key}")
    p(_lag_line(r["lag"]))
    p(_rss_line(r["rss_mib"]))
    if r["sessions_counted"] is not None:
        c = r["sessions_counted"]
        p(f"server's count during the run: served {c['served']}  refused {c['refused']}  failed {c['failed']}; "
          f"active at the end {r['active_after']:.0f}")
    if "after" in r:
        a = r["after"]
        if a["result"] == "served":
            waited = f" (after {a['start_s']:.1f} s of refusals)" if a["start_s"] > 0.5 else ""
            p(f"after the run, one conversation alone: served{waited}, "
              f"voice-to-voice client {_ms(a['client_v2v_ms'])}, server {_ms(a['server_v2v_ms'])}")
        else:
            p(f"after the run, one conversation alone: NOT served ({a['result']}: {a['reason']})")
    p(f"  {'conv':>5} {'start_s':>7} {'result':<8} {'client':>8} {'server':>8}  heard -> reply / reason")
    for o in r["outcomes"]:
        p(_outcome_line(o))


# ---- soak ---------------------------------------------------------------------------------------
async def run_soak(url: str, questions: list[Question], conversations: int, seconds: float,
                   reply_timeout: float = 30.0, marks=SOAK_MARKS, progress=None) -> dict:
    url = ws_url(url)
    outcomes: list[Outcome] = []
    rss: dict[int, float | None] = {}
    start = rss_mib(await metrics_now(url))
    loop = asyncio.get_running_loop()
    t = loop.time()
    for i in range(conversations):
        outcomes.append(await one_conversation(url, questions[i % len(questions)], i, seconds, reply_timeout))
        k = i + 1
        if k in marks or k == conversations:
            rss[k] = rss_mib(await metrics_now(url))
            if progress is not None:
                progress(k, rss[k], outcomes)
    s = summarize(outcomes)
    growth = None
    if rss.get(10) is not None and rss.get(conversations) is not None and conversations > 10:
        growth = round(rss[conversations] - rss[10], 1)
    return {"url": url, "conversations": conversations, "seconds": seconds, "wall_s": round(loop.time() - t, 1),
            "rss_mib_start": start, "rss_mib": rss, "growth_after_10_mib": growth,
            "failures": s["refused"] + s["dropped"] + s["failed"], **s,
            "outcomes": [asdict(o) for o in outcomes]}


def print_soak(r: dict, out=None) -> None:
    p = lambda *a: print(*a, file=out or sys.stdout)
    p(f"duplex bench soak: {r['conversations']} sequential conversations against {r['url']}, "
      f"{r['wall_s']} s in all")
    marks = "  ".join(f"after {k}: {'-' if v is None else f'{v:.1f}'}" for k, v in r["rss_mib"].items())
    start = r["rss_mib_start"]
    p(f"RSS (server, MiB): before {'-' if start is None else f'{start:.1f}'}  {marks}")
    g = r["growth_after_10_mib"]
    p(f"RSS growth after the first 10: {'n/a' if g is None else f'{g:+.1f} MiB'}")
    p(f"failures {r['failures']} (refused {r['refused']}  dropped {r['dropped']}  failed to connect {r['failed']});"
      f" served {r['served']}")
    p(_v2v_line("voice-to-voice, client", r["client_v2v_ms"]))
    p(_v2v_line("voice-to-voice, server", r["server_v2v_ms"]))
    for o in r["outcomes"]:
        if o["result"] != "served":
            p(_outcome_line(o))


# ---- command line -------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    from agent.serving.cli import positive_int

    p = argparse.ArgumentParser(prog="duplex bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("load", "N conversations at once (staggered) against a running duplex serve"),
                        ("soak", "sequential conversations; RSS as they go")):
        s = sub.add_parser(name, help=help_, description=help_)
        s.add_argument("--url", default="ws://127.0.0.1:8080", help="the server (ws://HOST:PORT[/ws])")
        s.add_argument("--token", default=None, help="the server's --auth-token")
        s.add_argument("--seconds", type=float, default=8.0,
                       help="audio per conversation: the question, then silence until the reply ends (default 8)")
        s.add_argument("--reply-timeout", type=float, default=30.0,
                       help="after the audio, wait this long for the reply to begin before counting it "
                            "dropped (default 30)")
        s.add_argument("--dev-dir", type=Path, default=None, help="dev clips, used when flite is missing")
        s.add_argument("--json", dest="json_out", type=Path, default=None, help="write all figures to this JSON file")
        if name == "load":
            s.add_argument("--sessions", type=positive_int, default=4)
            s.add_argument("--stagger-s", type=float, default=0.25, help="between conversation starts")
            s.add_argument("--after-wait", type=float, default=15.0,
                           help="the conversation after the run is retried this long while refused")
        else:
            s.add_argument("--conversations", type=positive_int, default=200)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.reply_timeout <= 0:
        p.error("--seconds and --reply-timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    url = ws_url(args.url, args.token)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as work:
        questions = build_questions(Path(work), args.dev_dir)
    if args.command == "load":
        report = asyncio.run(run_load(url, questions, args.sessions, args.seconds, args.stagger_s,
                                      args.reply_timeout, after_wait_s=args.after_wait))
        print_load(report)
        ok = report["dropped"] == 0 and report["failed"] == 0 and report["after"]["result"] == "served"
    else:
        def progress(k, rss, outcomes):
            bad = sum(o.result != "served" for o in outcomes)
            print(f"  {k} conversations: RSS {'-' if rss is None else f'{rss:.1f} MiB'}, {bad} failed so far",
                  flush=True)

        report = asyncio.run(run_soak(url, questions, args.conversations, args.seconds, args.reply_timeout,
                                      progress=progress))
        print_soak(report)
        ok = report["failures"] == 0
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2))
        print(f"figures written to {args.json_out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
