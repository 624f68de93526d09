"""`duplex bench tools`: does the agent call the right tool, and what does a tool cost the caller?

Spoken requests (flite, four voices) go at real-time pace through the WAV transport into a real
`Session` serving an agent with four tools (the README's weather and time, a table booking,
end_call), one session per request so that no request sees another's calls; each call begins with
the agent's greeting, which the caller hears out (`GREETING_S`) before asking, as on a phone line.
Half the requests need a tool, half are chit-chat that needs none. For each LLM it prints:
- right tool and arguments: the share of tool requests whose first call named the expected tool
  with the expected arguments (strings compared without case or surrounding space);
- false calls: the share of chit-chat requests where the model asked for any tool;
- voice-to-voice (exact end of speech to the first reply audio: a filler or the answer) of the
  tool requests and of the chit-chat ones, p50 and p90, and of the chit-chat requests to the same
  agent without tools (what offering tools costs a turn that needs none).
The recognizer, the voice and the models' settings are duplex's defaults; only the LLM varies.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.bench.latency import ASR_RATE, LEAD_S, _pct, speech_end_offset
from agent.bench.quality import speak
from agent.toolkit.call_control import end_call
from agent.toolkit.tools import ToolPolicy, function_tool
from agent.toolkit.voice_agent import Agent, load_agent
from llm import bundled

VOICES = ("slt", "kal", "awb", "rms")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "weather_agent.py"  # the README's agent: its weather and time tools


@function_tool
def book_table(people: int, time: str) -> str:
    """Book a table at the restaurant.

    Args:
        people: How many people.
        time: When, for example 8 pm.
    """
    return f"booked for {people} at {time}"


@functools.cache
def bench_agent() -> Agent:
    """The agent measured: the README's weather and time tools, a table booking and end_call."""
    if not EXAMPLE.exists():
        raise RuntimeError(f"examples/weather_agent.py is not in {ROOT}: run from a checkout of duplex")
    example = {t.name: t for t in load_agent(f"{EXAMPLE}:agent").tools}
    return Agent(instructions="You are a restaurant's phone assistant. Use the tools for the weather, the time, "
                              "bookings and ending the call. Reply in one short sentence.",
                 tools=[example["get_weather"], example["get_time"], book_table, end_call],
                 tool_policy=ToolPolicy(filler_delay_s=1.0), greeting="Hello, how can I help?")


GREETING_S = 3.0  # the caller listens to the greeting before asking (the session reads the tools meanwhile)


@dataclass(frozen=True)
class Request:
    text: str
    tool: str | None  # None: chit-chat, no tool needed
    args: tuple[tuple[str, object], ...] = ()


REQUESTS = [
    Request("What's the weather in Paris?", "get_weather", (("city", "paris"),)),
    Request("How are you today?", None),
    Request("Is it going to rain in London?", "get_weather", (("city", "london"),)),
    Request("What is the capital of Italy?", None),
    Request("What time is it in Tokyo?", "get_time", (("city", "tokyo"),)),
    Request("Tell me a joke.", None),
    Request("Book a table for four people at eight pm.", "book_table", (("people", 4),)),
    Request("What do you think about cats?", None),
    Request("Thank you, goodbye.", "end_call"),
    Request("My name is Anna.", None),
    Request("What's the weather like in Berlin?", "get_weather", (("city", "berlin"),)),
    Request("How many legs does a spider have?", None),
]


def right_call(request: Request, calls: list[tuple[str, dict]]) -> bool:
    if not calls or calls[0][0] != request.tool:
        return False
    args = calls[0][1]
    for key, want in request.args:
        got = args.get(key)
        if isinstance(want, str):
            if not isinstance(got, str) or got.strip().lower() != want:
                return False
        elif got != want and str(got).strip() != str(want):
            return False
    return True


async def one_request(models, pcm: np.ndarray, speech_end_s: float, work: Path, name: str,
                      agent: Agent) -> dict:
    from agent.conversation.session import Session, SessionConfig
    from agent.conversation.session_events import ToolCallStarted
    from agent.tracing.trace import Ev, Stage, Tracer
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    transport = WavConversationTransport([ScriptedTurn(pcm, ASR_RATE, name)], models.tts.sample_rate,
                                         str(work / f"{name}.wav"), gap_s=0.5, reply_timeout_s=30.0)
    tracer = Tracer(name, capacity=1 << 14)
    session = Session(models, transport, SessionConfig(), tracer=tracer, session_id=name, agent=agent)
    ran: list[tuple[str, dict]] = []
    session.on(ToolCallStarted, lambda ev: ran.append((ev.name, ev.arguments)))
    try:
        await session.run()
    finally:
        transport.close()
    # what the model asked for, run or not (an unknown tool, a call refused)
    asked = sum(e.args.get("tool_calls", 0) for e in tracer.events() if e.stage == Stage.LLM and e.name == Ev.GENERATE)
    end = transport.t0 + transport.input_start_times[0] + speech_end_s
    rec = next((r for r in session.records if r.user_text), None)  # the request's turn, not the greeting
    v2v = (rec.first_audio_out - end) * 1000 if rec is not None and rec.first_audio_out else None
    return {"heard": rec.user_text if rec else "", "reply": rec.heard_text if rec else "", "calls": ran,
            "asked": asked, "voice_to_voice_ms": round(v2v, 1) if v2v is not None else None}


async def run_model(models, script: list[tuple[Request, str, np.ndarray, float]], work: Path) -> list[dict]:
    agent = bench_agent()
    plain = Agent(instructions=agent.instructions, examples=agent.examples, greeting=agent.greeting)  # what chit-chat costs without tools
    rows = []
    for i, (request, voice, pcm, end) in enumerate(script):
        row = await one_request(models, pcm, end, work, f"r{i}", agent)
        row.update(request=request.text, voice=voice, want=request.tool,
                   right=right_call(request, row["calls"]) if request.tool else None,
                   false_call=bool(row["asked"]) if request.tool is None else None)
        rows.append(row)
        mark = {True: "ok", False: "WRONG", None: "false call" if row["false_call"] else "ok"}[row["right"]]
        print(f"  {request.text[:42]:<42} {voice:<4} {mark:<10} v2v {row['voice_to_voice_ms']!s:>7} ms  "
              f"calls {[c[0] for c in row['calls']]}  heard {row['heard']!r} -> {row['reply'][:60]!r}", flush=True)
    for i, (request, voice, pcm, end) in enumerate(script):
        if request.tool is None:
            row = await one_request(models, pcm, end, work, f"p{i}", plain)
            rows.append({**row, "request": request.text, "voice": voice, "want": None, "right": None,
                         "false_call": None, "no_tools": True})
            print(f"  {request.text[:42]:<42} {voice:<4} {'no tools':<10} v2v {row['voice_to_voice_ms']!s:>7} ms  "
                  f"-> {row['reply'][:60]!r}", flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    tool = [r for r in rows if r["want"]]
    chat = [r for r in rows if not r["want"] and not r.get("no_tools")]
    plain = [r for r in rows if r.get("no_tools")]
    v2v_tool = [r["voice_to_voice_ms"] for r in tool if r["voice_to_voice_ms"] is not None]
    v2v_chat = [r["voice_to_voice_ms"] for r in chat if r["voice_to_voice_ms"] is not None]
    v2v_plain = [r["voice_to_voice_ms"] for r in plain if r["voice_to_voice_ms"] is not None]
    return {"right_tool_and_args": round(sum(r["right"] for r in tool) / len(tool), 3) if tool else None,
            "false_calls_on_chitchat": round(sum(r["false_call"] for r in chat) / len(chat), 3) if chat else None,
            "tool_turns": len(tool), "chitchat_turns": len(chat),
            "v2v_tool_p50_ms": _pct(v2v_tool, 50), "v2v_tool_p90_ms": _pct(v2v_tool, 90),
            "v2v_chitchat_p50_ms": _pct(v2v_chat, 50), "v2v_chitchat_p90_ms": _pct(v2v_chat, 90),
            "v2v_no_tools_p50_ms": _pct(v2v_plain, 50), "v2v_no_tools_p90_ms": _pct(v2v_plain, 90)}


def default_llms() -> list[str]:
    names = [bundled.DEFAULT, "qwen2.5-0.5b"]
    try:
        bundled.resolve("qwen2.5-1.5b")
        names.append("qwen2.5-1.5b")
    except Exception:  # noqa: BLE001 - the optional package is not installed
        pass
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="duplex bench tools", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llm", action="append", help=f"an LLM to measure (repeat; default: {', '.join(default_llms())})")
    p.add_argument("--requests", type=int, default=len(REQUESTS), help="how many of the requests (alternating kinds)")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from agent.conversation.models import ModelChoice, load_models
    from llm import load_chat_model

    work = Path(tempfile.mkdtemp(prefix="duplex-bench-tools-"))
    script = []
    lead = np.zeros(int((GREETING_S + LEAD_S) * ASR_RATE), np.float32)
    for i, request in enumerate(REQUESTS[:args.requests]):
        voice = VOICES[i % len(VOICES)]
        pcm = np.concatenate([lead, speak(request.text, voice, work / f"q{i}.wav"), np.zeros(ASR_RATE // 2, np.float32)])
        script.append((request, voice, pcm, speech_end_offset(pcm, ASR_RATE)))
    llms = args.llm or default_llms()
    models = load_models(ModelChoice(llm=llms[0]))
    results = {}
    for name in llms:
        if name != llms[0]:
            models.llm = load_chat_model(name)
        print(f"\n== {name} ({len(script)} requests) ==", flush=True)
        t = time.perf_counter()
        rows = asyncio.run(run_model(models, script, work))
        results[name] = {"summary": summarize(rows), "rows": rows, "wall_s": round(time.perf_counter() - t, 1)}
    print(f"\n{'llm':<22} {'right tool+args':>15} {'false calls':>12} {'v2v p50/p90 ms: tool turns':>27} "
          f"{'chit-chat':>15} {'same, no tools':>15}")
    for name, res in results.items():
        s = res["summary"]
        print(f"{name:<22} {_share(s['right_tool_and_args'], s['tool_turns']):>15} "
              f"{_share(s['false_calls_on_chitchat'], s['chitchat_turns']):>12} "
              f"{_pair(s['v2v_tool_p50_ms'], s['v2v_tool_p90_ms']):>27} "
              f"{_pair(s['v2v_chitchat_p50_ms'], s['v2v_chitchat_p90_ms']):>15} "
              f"{_pair(s['v2v_no_tools_p50_ms'], s['v2v_no_tools_p90_ms']):>15}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


def _share(x, n) -> str:
    return "-" if x is None else f"{x * 100:.0f} % of {n}"


def _pair(a, b) -> str:
    return f"{a if a is not None else '-'} / {b if b is not None else '-'}"


if __name__ == "__main__":
    sys.exit(main())
