"""Tool calls in the real Session, with a scripted LLM that calls tools (tests/doubles.py): a tool
turn end to end, speculation that never runs a tool before the commit, barge-in over
interruptible and uninterruptible tools, the filler, failures, timeouts, the step limit, one
run per call, call/result pairs through context trimming, and end_call after the goodbye played.
No models; the conversation's seconds on the virtual clock (tests/virtual_time.py)."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from agent import Agent, ToolPolicy, function_tool
from agent.toolkit.call_control import end_call
from agent.conversation.session import Models, Session
from agent.conversation.session_events import BargeIn, ReplyFinished, ToolCallFinished, ToolCallStarted, UserTurnFinal
from agent.tracing.trace import Ev, Stage, Tracer
from doubles import EnergyVAD, ScriptedRecognizer, ToneVoice, ToolScriptLLM, burst, said
from llm.base import ToolCall
from test_session_orchestration import config, turn
from transport.wavfile import WavConversationTransport

pytestmark = pytest.mark.usefixtures("virtual_clock")

RATE = 16000
QUICK = ToolPolicy(filler_delay_s=5.0)  # no filler unless a test wants one


def spoken(seconds: float = 0.8, seed: int = 0) -> np.ndarray:
    return np.concatenate([np.zeros(int(0.3 * RATE), np.float32), burst(seconds, seed)])


async def converse(tmp_path, turns, script, agent, cfg=None, events=None):
    wav = WavConversationTransport(turns, RATE, str(tmp_path / "out.wav"), gap_s=0.3, reply_timeout_s=8.0)
    llm = ToolScriptLLM(script)
    models = Models(asr=ScriptedRecognizer([t for t in script.heard]), llm=llm, tts=ToneVoice(), vad_factory=EnergyVAD)
    tracer = Tracer("t", capacity=1 << 14)
    session = Session(models, wav, cfg or config(speculate=False), tracer=tracer, agent=agent)
    seen = []
    for kind in events or ():
        session.on(kind, seen.append)
    await asyncio.wait_for(session.run(), timeout=40)
    wav.close()
    return session, wav, llm, tracer, seen


class Script:
    """What the user says (`heard`, one text per burst) and how the model answers: `answer(messages,
    tools)` if given; else a tool's round's results are read back as "Done: <result>; <result>." and a user turn gets
    `on_user(text)`."""

    def __init__(self, heard: list[str], on_user=None, answer=None):
        self.heard, self.on_user, self.answer = heard, on_user, answer

    def __call__(self, messages, tools):
        if self.answer is not None:
            return self.answer(messages, tools)
        results = []
        for m in reversed(messages):  # the last round's results, read back in order
            if m["role"] != "tool":
                break
            results.insert(0, m["content"])
        if results:
            return said(f"Done: {'; '.join(results)}.")
        return self.on_user(messages[-1]["content"])


def call(name: str, **args) -> ToolCall:
    return ToolCall(f"call_{name}_{json.dumps(args, sort_keys=True)}", name, json.dumps(args))


def log(wav, kind):
    return [e for e in wav.events_log if e["type"] == kind]


def audio_text(wav) -> str:
    return " ".join(e["text"] for e in log(wav, "audio") if e["text"])


def tool_messages(messages):
    return [m for m in messages if m["role"] == "tool"]


def pairs_hold(messages) -> bool:
    """Every tool result follows the assistant message that made its call."""
    open_ids: set[str] = set()
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            open_ids = {c["id"] for c in m["tool_calls"]}
        elif m["role"] == "tool":
            if m["tool_call_id"] not in open_ids:
                return False
        else:
            open_ids = set()
    return True


async def test_a_tool_turn_end_to_end(tmp_path):
    cities = []

    @function_tool
    async def get_weather(city: str) -> str:
        """Today's weather in a city.

        Args:
            city: the city's name
        """
        cities.append(city)
        return f"sunny and 21 degrees in {city}"

    script = Script(["what's the weather in Paris"],
                    lambda user: said("Let me look.") + [call("get_weather", city="Paris")])
    session, wav, llm, tracer, seen = await converse(
        tmp_path, [turn(spoken())], script, Agent("You help.", tools=[get_weather], tool_policy=QUICK),
        events=[UserTurnFinal, ToolCallStarted, ToolCallFinished, ReplyFinished])
    assert cities == ["Paris"]
    spec = llm.offered[0][0]["function"]
    assert spec["name"] == "get_weather" and spec["parameters"]["properties"]["city"]["description"] == "the city's name"
    assert spec["parameters"]["required"] == ["city"] and "weather" in spec["description"]
    # the second request reads the call and its result
    second = llm.requests[1]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert second[-1] == {"role": "tool", "content": "sunny and 21 degrees in Paris",
                          "tool_call_id": second[-2]["tool_calls"][0]["id"]}
    (rec,) = list(session.records)
    assert rec.heard_text == "Let me look. Done: sunny and 21 degrees in Paris."
    assert "sunny" in audio_text(wav) and "tool_call" not in audio_text(wav)
    # the history keeps the call, its result and what was heard around them
    assert [m["role"] for m in session.history] == ["user", "assistant", "tool", "assistant"]
    assert session.history[1]["content"] == "Let me look." and pairs_hold(session.history)
    assert session.history[3]["content"] == "Done: sunny and 21 degrees in Paris."
    assert [type(e).__name__ for e in seen] == ["UserTurnFinal", "ToolCallStarted", "ToolCallFinished",
                                                "ReplyFinished"]
    assert seen[1].arguments == {"city": "Paris"} and seen[2].status == "ok"
    spans = [e for e in tracer.events() if e.stage == Stage.TOOL and e.name == Ev.TOOL_CALL]
    assert len(spans) == 1 and spans[0].args["status"] == "ok" and spans[0].dur_ns > 0
    assert not [e for e in tracer.events() if e.name == Ev.FILLER], "a quick tool needs no filler"


async def test_a_speculative_reply_holds_its_tool_call_until_the_turn_is_committed(tmp_path):
    ran_at = []

    @function_tool
    def check_order(number: int) -> str:
        """Look up an order."""
        ran_at.append(time.perf_counter_ns())
        return "shipped"

    script = Script(["where is order five"], lambda user: [call("check_order", number=5)])
    session, wav, llm, tracer, _ = await converse(
        tmp_path, [turn(spoken(0.6))], script, Agent(tools=[check_order], tool_policy=QUICK), config())
    (rec,) = list(session.records)
    assert rec.speculative, "the speculation was committed"
    commit = next(e.ts_ns for e in tracer.events() if e.stage == Stage.SPECULATION and e.name == Ev.COMMIT)
    first_request = next(e.ts_ns for e in tracer.events() if e.stage == Stage.LLM and e.name == Ev.REQUEST)
    assert first_request < commit, "the model was asked (and called the tool) before the turn ended"
    assert len(ran_at) == 1 and ran_at[0] >= commit, "the tool ran only once the turn was committed"
    assert rec.heard_text == "Done: shipped."


async def test_a_cancelled_speculation_never_runs_its_tool(tmp_path):
    # "what's the weather in" [0.35 s pause: a speculation starts] "Paris": the guess calls the
    # tool with "in", and is cancelled when the user goes on
    speech = np.concatenate([burst(0.6), np.zeros(int(0.35 * RATE), np.float32), burst(0.5, seed=1)])
    cities = []

    @function_tool
    async def get_weather(city: str) -> str:
        """Weather."""
        cities.append(city)
        return "rain"

    script = Script(["what's the weather in", "Paris"],
                    lambda user: [call("get_weather", city=user.split()[-1].strip(".?"))])
    session, wav, llm, tracer, _ = await converse(
        tmp_path, [turn(np.concatenate([np.zeros(int(0.3 * RATE), np.float32), speech]))], script,
        Agent(tools=[get_weather], tool_policy=QUICK), config())
    assert session.speculation_stats["cancelled"] >= 1
    assert llm.requests[0][-1]["content"] == "What's the weather in.", "the guess reached its tool call"
    assert cities == ["Paris"], "only the committed reply's call ran"


async def test_a_barge_in_cancels_an_interruptible_tool_and_keeps_the_pair(tmp_path):
    cancelled = asyncio.Event()

    @function_tool
    async def search_flights(destination: str) -> str:
        """Search flights."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "none"

    script = Script(["find me a flight to Rome", "never mind"],
                    lambda user: [call("search_flights", destination="Rome")] if "flight" in user else said("Okay."))
    agent = Agent(tools=[search_flights], tool_policy=ToolPolicy(filler_delay_s=0.3, filler_phrases=("One moment.",)))
    session, wav, llm, tracer, seen = await converse(
        tmp_path, [turn(spoken()), turn(burst(0.6, seed=2), after=1.5)], script, agent, events=[BargeIn])
    assert cancelled.is_set(), "the tool was cancelled by the barge-in"
    first = session.records[0]
    assert first.interrupted and seen and seen[0].turn == 0
    history = session.history
    assert pairs_hold(history)
    (result,) = tool_messages(history)
    assert "cancelled" in result["content"]
    # the next turn's prompt holds the pair, and what was heard (the filler) with the call
    prompt = llm.requests[-1]
    assert prompt[-1] == {"role": "user", "content": "Never mind."} and tool_messages(prompt) == [result]
    assert next(m for m in prompt if m.get("tool_calls"))["content"] == "One moment."
    assert session.records[1].reply_text == "Okay."


async def test_an_uninterruptible_tool_finishes_and_the_next_turn_reads_its_result(tmp_path):
    booked = []

    @function_tool(interruptible=False)
    async def book_table(time_of_day: str) -> str:
        """Book a table."""
        await asyncio.sleep(1.5)
        booked.append(time_of_day)
        return f"booked for {time_of_day}"

    script = Script(["book a table at eight", "is it done"],
                    lambda user: [call("book_table", time_of_day="8 pm")] if "book" in user.lower() else said("Let me see."))
    agent = Agent(tools=[book_table], tool_policy=ToolPolicy(filler_delay_s=0.3))
    session, wav, llm, tracer, _ = await converse(
        tmp_path, [turn(spoken()), turn(burst(0.6, seed=2), after=1.0)], script, agent)
    assert booked == ["8 pm"], "the booking ran to its end despite the barge-in"
    assert session.records[0].interrupted
    prompt = llm.requests[-1]
    assert prompt[-1]["content"] == "Is it done?"
    assert [m["content"] for m in tool_messages(prompt)] == ["booked for 8 pm"], \
        "the new turn was answered with the result in context"
    assert pairs_hold(prompt)


async def test_the_filler_is_said_while_a_slow_tool_runs(tmp_path):
    @function_tool
    async def slow_lookup(item: str) -> str:
        """Slow."""
        await asyncio.sleep(1.2)
        return "found"

    script = Script(["look up my parcel"], lambda user: [call("slow_lookup", item="parcel")])
    agent = Agent(tools=[slow_lookup], tool_policy=ToolPolicy(filler_delay_s=0.4, filler_phrases=("Hold on.",)))
    session, wav, llm, tracer, _ = await converse(tmp_path, [turn(spoken())], script, agent)
    (rec,) = list(session.records)
    assert rec.heard_text == "Hold on. Done: found."
    (filler,) = [e for e in tracer.events() if e.name == Ev.FILLER]
    call_span = next(e for e in tracer.events() if e.name == Ev.TOOL_CALL)
    assert filler.args["text"] == "Hold on." and filler.ts_ns - call_span.ts_ns >= 0.39e9
    assert session.history[1] == {"role": "assistant", "content": "Hold on.", "tool_calls": session.history[1]["tool_calls"]}
    # the reply's first audio is the filler: voice-to-voice counts it
    assert log(wav, "audio")[0]["text"] in "Hold on."


async def test_the_filler_covers_a_slow_answer_after_a_quick_tool(tmp_path):
    @function_tool
    def lookup(item: str) -> str:
        """Quick."""
        return "found"

    class SlowAnswer(ToolScriptLLM):
        async def stream(self, messages, max_tokens=None, tools=None):
            if messages[-1]["role"] == "tool":
                await asyncio.sleep(0.8)  # a cold prompt to evaluate before the answer's first token
            async for item in super().stream(messages, max_tokens, tools):
                yield item

    script = Script(["look up my parcel"], lambda user: [call("lookup", item="parcel")])
    agent = Agent(tools=[lookup], tool_policy=ToolPolicy(filler_delay_s=0.4, filler_phrases=("Hold on.",)))
    wav = WavConversationTransport([turn(spoken())], RATE, str(tmp_path / "out.wav"), gap_s=0.3, reply_timeout_s=8.0)
    models = Models(asr=ScriptedRecognizer(script.heard), llm=SlowAnswer(script), tts=ToneVoice(), vad_factory=EnergyVAD)
    session = Session(models, wav, config(speculate=False), agent=agent)
    await asyncio.wait_for(session.run(), timeout=40)
    wav.close()
    assert session.records[0].heard_text == "Hold on. Done: found."


async def test_an_agent_without_fillers_says_none(tmp_path):
    @function_tool
    async def slow_lookup(item: str) -> str:
        """Slow."""
        await asyncio.sleep(0.8)
        return "found"

    script = Script(["look up my parcel"], lambda user: [call("slow_lookup", item="parcel")])
    agent = Agent(tools=[slow_lookup], tool_policy=ToolPolicy(filler_delay_s=0.2, filler_phrases=()))
    session, wav, *_ = await converse(tmp_path, [turn(spoken())], script, agent)
    assert session.records[0].heard_text == "Done: found."


async def test_a_failing_and_a_timed_out_tool_are_answered_as_failures(tmp_path):
    @function_tool
    def order_food(dish: str) -> str:
        """Order."""
        raise RuntimeError("the kitchen is closed")

    @function_tool(timeout_s=0.3)
    async def call_taxi(street: str) -> str:
        """Taxi."""
        await asyncio.sleep(10)
        return "on its way"

    script = Script(["order soup and a taxi"],
                    lambda user: [call("order_food", dish="soup"), call("call_taxi", street="Main")])
    session, wav, llm, tracer, seen = await converse(
        tmp_path, [turn(spoken())], script, Agent(tools=[order_food, call_taxi], tool_policy=QUICK),
        events=[ToolCallFinished])
    food, taxi = tool_messages(llm.requests[1])
    assert "the kitchen is closed" in json.loads(food["content"])["error"]
    assert "timed out" in json.loads(taxi["content"])["error"]
    assert sorted(e.status for e in seen) == ["error", "error"]
    assert "kitchen is closed" in session.records[0].heard_text, "the user hears an answer"


async def test_bad_arguments_and_unknown_tools_are_answered_to_the_model(tmp_path):
    @function_tool
    def set_alarm(hour: int) -> str:
        """Alarm."""
        return "set"

    script = Script(["wake me"], lambda user: [call("set_alarm", hour="noonish"), call("launch_rocket")])
    session, wav, llm, _, seen = await converse(tmp_path, [turn(spoken())], script,
                                                Agent(tools=[set_alarm], tool_policy=QUICK),
                                                events=[ToolCallStarted, ToolCallFinished])
    bad, unknown = (json.loads(m["content"])["error"] for m in tool_messages(llm.requests[1]))
    assert "invalid arguments" in bad and "hour" in bad
    assert "no tool named 'launch_rocket'" in unknown
    # a program hears of every call, the unknown one too
    finished = {e.name: e.status for e in seen if isinstance(e, ToolCallFinished)}
    assert finished == {"set_alarm": "error", "launch_rocket": "error"}
    assert {e.name for e in seen if isinstance(e, ToolCallStarted)} == {"set_alarm", "launch_rocket"}


async def test_the_step_limit_ends_the_tool_rounds_with_an_answer(tmp_path):
    runs = []

    @function_tool
    def next_page(page: int) -> str:
        """Paginate."""
        runs.append(page)
        return "more"

    def on_any(messages, tools):
        return [call("next_page", page=len(tool_messages(messages)) + 1)]

    llm_script = Script(["read everything"], answer=on_any)
    agent = Agent(tools=[next_page], tool_policy=ToolPolicy(max_steps=2, filler_delay_s=5.0, no_answer="I give up."))
    session, wav, llm, tracer, _ = await converse(tmp_path, [turn(spoken())], llm_script, agent)
    assert runs == [1, 2] and len(llm.requests) == 3
    assert [e.name for e in tracer.events() if e.name == Ev.TOOL_REFUSED] == [Ev.TOOL_REFUSED]
    assert session.records[0].heard_text == "I give up.", "never silence"


async def test_the_same_call_runs_once_in_a_reply(tmp_path):
    runs = []

    @function_tool
    def get_balance(account: str) -> str:
        """Balance."""
        runs.append(account)
        return "12 euros"

    def answer(messages, tools):
        results = tool_messages(messages)
        if len(results) >= 3:
            return said("You have 12 euros.")
        # twice in one round, then once more in the next
        return [call("get_balance", account="main"), ToolCall("again", "get_balance", '{"account": "main"}')] \
            if not results else [ToolCall("third", "get_balance", '{ "account":"main" }')]

    llm_script = Script(["my balance"], answer=answer)
    session, wav, llm, *_ = await converse(tmp_path, [turn(spoken())], llm_script,
                                           Agent(tools=[get_balance], tool_policy=QUICK))
    assert runs == ["main"]
    assert [m["content"] for m in tool_messages(llm.requests[-1])] == ["12 euros"] * 3
    assert session.records[0].heard_text == "You have 12 euros."


async def test_context_trimming_keeps_tool_calls_with_their_results(tmp_path):
    @function_tool
    def roll_die() -> str:
        """Roll."""
        return "4"

    script = Script(["roll", "roll again", "once more", "and again"], lambda user: [call("roll_die")])
    turns = [turn(spoken())] + [turn(burst(0.6, seed=i), after=None) for i in range(1, 4)]
    session, wav, llm, *_ = await converse(tmp_path, turns, script, Agent(tools=[roll_die], tool_policy=QUICK),
                                           config(speculate=False, max_history_messages=6))
    assert len(session.records) == 4
    for prompt in llm.requests:
        assert pairs_hold(prompt[1:]), prompt
        assert prompt[1]["role"] == "user", "the context starts at a user's turn"
    assert len(session.history) <= 6 and pairs_hold(session.history)


async def test_end_call_hangs_up_only_after_the_goodbye_was_played(tmp_path):
    def goodbye(messages, tools):
        if messages[-1]["role"] == "tool":
            return said("Goodbye, have a nice day.")
        return [call("end_call")] if "goodbye" in messages[-1]["content"] else said("Yes?")

    llm_script = Script(["thanks goodbye", "wait one more thing"], answer=goodbye)
    turns = [turn(spoken()), turn(burst(0.6, seed=2), after=4.0)]  # the caller would speak again later
    session, wav, llm, tracer, _ = await converse(tmp_path, turns, llm_script, Agent(tools=[end_call],
                                                                                  tool_policy=QUICK))
    assert len(session.records) == 1, "the call ended before the caller's next words"
    (ended,) = log(wav, "call_ended")
    last_piece = log(wav, "audio")[-1]
    played_end = next(e["t"] for e in log(wav, "played_end") if e["id"] == last_piece["id"])
    assert ended["t"] >= played_end, "the call ended only after the goodbye's last piece was played"
    assert session.records[0].heard_text == "Goodbye, have a nice day."
    assert Ev.CALL_END in [e.name for e in tracer.events() if e.stage == Stage.TURN]


async def test_a_small_models_answer_round_reads_results_inline_and_offers_no_tools(tmp_path):
    from llm.tool_results import INLINE

    @function_tool
    def get_time(city: str) -> str:
        """Time."""
        return "noon"

    def answer(messages, tools):
        if tools:
            return [call("get_time", city="Rome")]
        # the answer round: it still writes a call (small models do), then answers from the note
        return ['{"name": "get_time", "arguments": {"city": "Rome"}}\n', "It", " is", " noon."]

    script = Script(["what time is it in Rome"], answer=answer)
    session, wav, llm, tracer, _ = await converse(
        tmp_path, [turn(spoken())], script,
        Agent(tools=[get_time], tool_policy=ToolPolicy(filler_delay_s=5.0, results=INLINE)))
    assert llm.offered[0] and llm.offered[1] is None, "the answer round offers no tools"
    assert llm.requests[1][-1] == {"role": "user", "content": "What time is it in Rome?"}
    assert llm.requests[1][0]["content"].endswith("\n\nget_time returned: noon")
    assert session.records[0].heard_text == "It is noon.", "the stray call was neither run nor said"
    assert [e.args["why"] for e in tracer.events() if e.name == Ev.TOOL_REFUSED] == ["the answer's round offers no tools"]
    assert [m["role"] for m in session.history] == ["user", "assistant", "tool", "assistant"]


async def test_tool_calls_are_a_stage_of_their_own_in_the_report_perfetto_and_otel(tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent.tracing.export import export_otlp, to_perfetto
    from agent.tracing.report import format_table, turn_table, write_waterfalls

    @function_tool
    async def slow_lookup(item: str) -> str:
        """Slow."""
        await asyncio.sleep(0.3)
        return "found"

    script = Script(["look up my parcel"], lambda user: [call("slow_lookup", item="parcel")])
    session, wav, llm, tracer, _ = await converse(tmp_path, [turn(spoken())], script,
                                                  Agent(tools=[slow_lookup], tool_policy=QUICK))
    (row,) = turn_table(tracer.events())
    assert row["tool_calls"] == 1 and 300 <= row["tools_ms"] < 1000
    assert "tools" in format_table([row]).splitlines()[0]
    (png,) = write_waterfalls(tracer.events(), str(tmp_path / "wf"))
    assert png.endswith(".png")
    doc = to_perfetto(tracer)
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert "tool" in tracks
    exporter = InMemorySpanExporter()
    export_otlp(tracer, span_exporter=exporter)
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert span.name == "execute_tool slow_lookup" and span.attributes["gen_ai.tool.name"] == "slow_lookup"


async def test_say_and_generate_reply_speak_when_the_floor_is_free_and_events_tell_a_program(tmp_path):
    from agent.conversation.session_events import DtmfReceived, ReplyStarted, SessionEnded
    from transport.base import ClientEvent

    class Host(Agent):
        async def on_enter(self, session):
            async def greet() -> None:
                await session.generate_reply(instructions="Greet the caller by name: Anna.")
                await session.say("How can I help?")

            asyncio.create_task(greet())

    def answer(messages, tools):
        return said("Hello Anna.") if "Anna" in messages[0]["content"] else said("Hm.")

    class KeyPress:
        """The far end presses 5 once its first audio frame is sent (the WAV far end plays the rest)."""

        def __init__(self, inner):
            self.inner, self.pressed = inner, False
            self.reports_playout = inner.reports_playout

        async def receive(self):
            if not self.pressed:
                self.pressed = True
                return ClientEvent("dtmf", {"digit": "5"})
            return await self.inner.receive()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    wav = WavConversationTransport([turn(np.zeros(int(4.0 * RATE), np.float32))], RATE, str(tmp_path / "out.wav"),
                                   gap_s=0.3, reply_timeout_s=8.0)
    llm = ToolScriptLLM(answer)
    models = Models(asr=ScriptedRecognizer([]), llm=llm, tts=ToneVoice(), vad_factory=EnergyVAD)
    session = Session(models, KeyPress(wav), config(speculate=False), agent=Host())
    seen = []
    for kind in (DtmfReceived, ReplyStarted, SessionEnded):
        session.on(kind, seen.append)
    await asyncio.wait_for(session.run(), timeout=30)
    wav.close()
    assert [r.reply_text for r in session.records] == ["Hello Anna.", "How can I help?"]
    assert llm.requests[0][0]["content"].endswith("Greet the caller by name: Anna.")
    assert session.history == [{"role": "assistant", "content": "Hello Anna."},
                               {"role": "assistant", "content": "How can I help?"}]
    assert seen[0] == DtmfReceived("5")
    assert [type(e).__name__ for e in seen[1:]] == ["ReplyStarted", "ReplyStarted", "SessionEnded"]
    assert len(seen[-1].records) == 2
