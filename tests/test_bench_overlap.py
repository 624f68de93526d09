"""`duplex bench overlap` (agent.bench.overlap): its metrics on made-up heard timelines, the page-like
player client (transport.web.client.play_along) against a tiny WebSocket server of our own, and
once the whole bench against the real server (models)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.asyncio.server import serve

from agent.bench import overlap as ov
from tests.helpers import flite_available
from transport.web.client import CuedMic, HeardChunk, PlayedConversation, play_along
from transport.web.protocol import encode_audio


def chunk(cid: int, start: float, end: float, levels=None, received: float | None = None) -> HeardChunk:
    """A heard chunk, voiced at -20 dBFS throughout unless `levels` says otherwise (per 10 ms)."""
    n = max(1, int(round((end - start) / 0.01)))
    return HeardChunk(cid, start, end, start - 0.3 if received is None else received,
                      tuple(levels) if levels is not None else (-20.0,) * n)


# ---- metrics ------------------------------------------------------------------------------------
def test_take_over_is_fd_benchs_one_second_or_more_than_three_words():
    assert not ov.take_over(None, 9)  # not heard
    assert not ov.take_over(2.0, 0)  # no words
    assert not ov.take_over(0.6, 3)  # short, few words: a backchannel, not a turn
    assert ov.take_over(0.6, 4)
    assert ov.take_over(1.0, 1)


def test_longest_silence_counts_holes_and_quiet_steps_in_the_heard_audio():
    quiet_middle = [-20.0] * 3 + [-90.0] * 4 + [-20.0] * 3  # 0.04 s of silence inside the chunk
    heard = [chunk(1, 0.0, 0.1), chunk(2, 0.1, 0.2, quiet_middle), chunk(3, 0.9, 1.0)]
    # from 0.05: the quiet 40 ms inside chunk 2, then the hole 0.2-0.9
    assert ov.longest_silence(heard, 0.05, 1.0) == pytest.approx(0.7)
    # to a window end past the audio: the silence after it counts (the reply was unfinished)
    assert ov.longest_silence(heard, 0.05, 2.5) == pytest.approx(1.5)
    # an onset inside the hole: from the onset to the next voiced step
    assert ov.longest_silence(heard, 0.5, 1.0) == pytest.approx(0.4)
    assert ov.longest_silence(heard, 0.0, 0.2) == pytest.approx(0.04)


def test_stop_latency_runs_to_the_flush_and_through_a_prompt_resume():
    story = [chunk(1, 0.0, 0.1), chunk(2, 0.1, 0.2), chunk(3, 0.2, 0.23)]  # chunk 3 cut by a clear at 0.23
    assert ov.stop_time(story, 0.05) == pytest.approx(0.23)
    resumed = story + [chunk(4, 0.5, 0.6)]  # back 0.27 s later: it had not stopped
    assert ov.stop_time(resumed, 0.05) == pytest.approx(0.6)
    later = story + [chunk(4, 0.8, 0.9)]  # 0.57 s later: stopped at the clear, then came back
    assert ov.stop_time(later, 0.05) == pytest.approx(0.23)
    assert ov.stop_time(story, 0.5) == pytest.approx(0.5)  # nothing playing at the onset


def test_chunks_belong_to_the_turn_of_the_last_bot_text_before_them():
    heard = [chunk(1, 1.0, 1.1, received=0.9), chunk(2, 1.1, 1.2, received=0.95), chunk(3, 3.0, 3.1, received=2.9)]
    assert ov.turn_of_chunks(heard, [(0.5, 0), (0.92, 0), (2.5, 1)]) == [0, 0, 1]
    assert ov.turn_of_chunks(heard, [(2.0, 4)]) == [None, None, 4]


def test_overlap_outcomes():
    kw = dict(story_finished=False, heard_after=True, cut=False, new_reply=False, paused=False)
    assert ov.overlap_outcome(**kw) == "went_on"
    assert ov.overlap_outcome(**{**kw, "paused": True}) == "resumed"
    assert ov.overlap_outcome(**{**kw, "paused": True, "heard_after": False}) == "stopped"
    assert ov.overlap_outcome(**{**kw, "heard_after": False, "story_finished": True}) == "went_on"
    assert ov.overlap_outcome(**{**kw, "cut": True, "heard_after": False}) == "cut"
    assert ov.overlap_outcome(**{**kw, "cut": True, "new_reply": True}) == "new_reply"


def _item(category: str) -> ov.Item:
    """A backchannel-like item: the story's speech ends 1.0 s in, the overlap lasts 0.4 s."""
    audio = np.zeros(16000, np.float32)
    return ov.Item(category, 0, "slt", "Tell me a story.", audio, (0.3, 1.0), -20.0, -60.0, 0,
                   overlap_text="Mm-hmm.", overlap=np.zeros(6400, np.float32), overlap_end_s=0.4, offset_s=2.0,
                   key=("paris",))


def _conversation(events: list[tuple[float, dict]], heard: list[HeardChunk]) -> PlayedConversation:
    c = PlayedConversation(events=[e for _, e in events], event_times=[t for t, _ in events], started=0.0)
    c.heard = heard
    return c


def _story(until: float, start: float = 2.0, cid: int = 100) -> list[HeardChunk]:
    return [chunk(cid + i, start + i * 0.1, start + (i + 1) * 0.1) for i in range(int(round((until - start) / 0.1)))]


def test_a_backchannel_the_story_resumes_after_is_resumed_and_its_hole_measured():
    # the story (turn 0) plays from 2.0; the overlap at 4.0; the page's player is cleared at
    # 4.1 and the story comes back at 4.4 (new chunk ids, no new bot_text), to the window's end
    heard = _story(4.1) + _story(10.5, start=4.4, cid=200)
    events = [(1.5, {"type": "bot_text", "turn": 0, "text": "Once"}), (4.1, {"type": "clear"}),
              (5.0, {"type": "final", "turn": 1, "text": ""})]
    row = ov.measure(_item("backchannel"), _conversation(events, heard), [0.0, 4.0], window_end=10.0)
    assert row["valid"] and row["story_turn"] == 0 and row["outcome"] == "resumed"
    assert row["paused"] and row["pause_after_s"] == pytest.approx(0.1) and not row["new_reply"]
    assert row["longest_silence_s"] == pytest.approx(0.3) and row["paused_for_s"] == pytest.approx(0.3)
    assert row["passed"]


def test_the_silence_a_pause_made_is_told_from_the_voice_falling_behind():
    heard = [chunk(1, 0.0, 0.5), chunk(2, 1.5, 2.0), chunk(3, 2.4, 3.0)]  # a hole 0.5-1.5, a clear at 2.0
    assert ov.longest_silence(heard, 0.2, 3.0) == pytest.approx(1.0)
    assert ov.paused_for(heard, [2.0], 3.0, -55.0) == pytest.approx(0.4)
    assert ov.paused_for(heard, [2.0], 2.2, -55.0) == pytest.approx(0.2)  # the window ended first


def test_a_new_reply_after_the_overlap_is_no_resume():
    heard = _story(4.1) + [chunk(300 + i, 6.0 + i * 0.1, 6.1 + i * 0.1, received=5.9) for i in range(15)]
    events = [(1.5, {"type": "bot_text", "turn": 0, "text": "Once"}), (4.1, {"type": "clear"}),
              (5.5, {"type": "interrupted", "heard": "Once upon"}), (5.8, {"type": "bot_text", "turn": 2, "text": "Paris."})]
    row = ov.measure(_item("backchannel"), _conversation(events, heard), [0.0, 4.0], window_end=10.0)
    assert row["outcome"] == "new_reply" and row["cut"] and row["new_turns"] == [2] and not row["passed"]
    assert row["longest_silence_s"] == pytest.approx(5.9)  # the story never came back
    # as an interruption: stopped at the clear, answered, and the answer took the turn
    row = ov.measure(_item("interruption"), _conversation(events, heard), [0.0, 4.0])
    assert row["stop_latency_s"] == pytest.approx(0.1) and row["answered"] and row["take_over"]
    assert row["response_latency_s"] == pytest.approx(6.0 - 4.4)


def test_a_story_that_ended_before_the_overlap_makes_the_item_invalid():
    events = [(1.5, {"type": "bot_text", "turn": 0, "text": "Once"}), (3.0, {"type": "bot_done", "turn": 0, "text": "Once"})]
    row = ov.measure(_item("backchannel"), _conversation(events, _story(3.0)), [0.0, 4.0], window_end=10.0)
    assert not row["valid"] and "ended" in row["reason"]


def _pause_item() -> ov.Item:
    """The user speaks 0.3-1.2 s, pauses until 2.4 s, and ends at 3.0 s."""
    return ov.Item("pause", 0, "kal", "Can you tell me how ... to bake bread?", np.zeros(48000, np.float32),
                   (0.3, 3.0), -20.0, -60.0, 0, pause=(1.2, 2.4))


def _replies(early_until: float, heard: str) -> tuple[list, list]:
    """The server ends a turn in the pause (1.7 s) and its reply plays from 2.0 until the clear;
    the reply to the whole utterance plays from 3.8 s."""
    early = [chunk(10 + i, 2.0 + i * 0.1, min(2.1 + i * 0.1, early_until), received=1.95)
             for i in range(int(round((early_until - 2.0) / 0.1)))]
    answer = [chunk(50 + i, 3.8 + i * 0.1, 3.9 + i * 0.1, received=3.7) for i in range(12)]
    events = [(1.7, {"type": "endpoint", "turn": 0, "speech_end_stream_s": 1.2}),
              (1.9, {"type": "bot_text", "turn": 0, "text": "Sure, I can help you with that."}),
              (early_until, {"type": "clear"}), (early_until + 0.4, {"type": "interrupted", "heard": heard}),
              (3.6, {"type": "bot_text", "turn": 1, "text": "Mix flour, water, yeast and salt."})]
    return events, early + answer


def test_a_pause_a_short_reply_spoke_into_is_split_but_no_take_over():
    events, heard = _replies(2.5, "Sure, I")  # 0.5 s heard, two words
    row = ov.measure(_pause_item(), _conversation(events, heard), [0.0])
    assert row["split"] and row["early_turns"] == [0] and not row["tor"]
    assert row["reply_turn"] == 1 and row["take_over"] and row["latency_s"] == pytest.approx(0.8)


def test_a_reply_heard_for_a_second_in_the_pause_takes_the_turn():
    events, heard = _replies(3.2, "Sure, I can help you")
    row = ov.measure(_pause_item(), _conversation(events, heard), [0.0])
    assert row["tor"] and row["split"]


def test_items_are_the_same_for_a_seed():
    said = lambda text, voice: np.sin(np.arange(8000) / 5.0).astype(np.float32) * 0.3  # noqa: E731
    a, b = ov.make_item("background", 3, 7, said), ov.make_item("background", 3, 7, said)
    assert a.overlap_voice != a.voice and a.overlap_voice == b.overlap_voice and a.offset_s == b.offset_s
    assert np.array_equal(a.overlap, b.overlap) and 1.5 <= a.offset_s <= 2.5
    assert ov.speech_level_db(a.overlap[:8000]) == pytest.approx(a.level_db - 20.0, abs=0.6)
    p = ov.make_item("pause", 0, 7, said)
    assert 1.0 <= p.pause[1] - p.pause[0] <= 1.5



def test_a_lone_step_of_hiss_is_no_onset_and_a_soft_consonant_is():
    rate, steps = ov.RATE, lambda n: np.arange(int(n * ov.RATE))
    x = np.zeros(rate, np.float32)
    x[800:880] = 0.004  # one 5 ms step 38 dB below the voice: hiss, no onset
    x[4000:4480] = 0.01 * np.sin(steps(0.03) / 3.0)  # a soft "s", 30 ms, 30 dB below
    x[6000:12000] = 0.5 * np.sin(steps(0.375) / 5.0)
    assert ov.speech_span(x) == pytest.approx((0.25, 0.75))
    assert ov.speech_span(x, min_run_s=0.005)[0] == pytest.approx(0.05)  # the old rule


@pytest.mark.skipif(not flite_available(), reason="needs flite")
def test_the_onset_is_where_flites_own_segment_times_put_the_first_phone(tmp_path):
    from agent.bench.quality import flite_speech_span, speak

    # (not kal's: its diphones open the silence with 65 ms of a 150-260 Hz sound 24-32 dB down)
    for voice, text in (("awb", "Wait, what is the capital of France?"), ("awb", "Yeah."),
                        ("rms", "Stop, what is the capital of Italy?"), ("slt", "Uh-huh.")):
        first_phone, _ = flite_speech_span(text, voice)  # the end of the silence flite opens with
        onset, _ = ov.speech_span(speak(text, voice, tmp_path / "x.wav"))
        assert abs(onset - first_phone) <= 0.03, (voice, text, onset, first_phone)


# ---- the page-like player client, against a server of our own -------------------------------------
async def test_the_player_plays_in_order_drops_what_is_unplayed_at_a_clear_and_reports_played_marks():
    got: list = []  # what the server received, in order

    async def handler(ws):
        hello = json.loads(await ws.recv())
        got.append(hello)
        await ws.send(json.dumps({"type": "ready", "sample_rate": 16000}))
        half = np.full(8000, 3000, np.int16)  # 0.5 s each
        for cid in (1, 2, 3, 4):
            await ws.send(encode_audio(cid, half))
        async for msg in ws:
            got.append(msg if isinstance(msg, bytes) else json.loads(msg))
            if isinstance(msg, str) and json.loads(msg).get("type") == "played" and json.loads(msg)["id"] == 1:
                await ws.send(json.dumps({"type": "clear"}))  # the page drops 2-4 and cuts 1
                await ws.send(encode_audio(5, half))  # what comes after the clear plays at once

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        loud = np.full(480, 0.5, np.float32)  # 30 ms
        mic = CuedMic(16000, [(loud, lambda c: c.first_heard_after(c.started or 0.0))],
                      done=lambda c: any(h.id == 5 for h in c.heard) and mic.sent_all)
        c = await asyncio.wait_for(play_along(f"ws://127.0.0.1:{port}/ws", mic, 16000, timeout_s=10.0), 15.0)

    assert got[0] == {"type": "hello", "sample_rate": 16000}
    marks = [m for m in got if isinstance(m, dict) and m.get("type") == "played"]
    assert [m["id"] for m in marks] == [1, 5] and all(m["event"] == "start" for m in marks)
    assert marks[0]["t"] <= marks[1]["t"]
    assert [h.id for h in c.heard] == [1, 5]
    assert c.heard[0].seconds < 0.5 and c.heard[1].start >= c.heard[0].end  # 1 cut at the clear
    assert c.dropped_s > 1.5 and not c.timed_out and c.marks_sent == 2
    assert [e["type"] for e in c.events] == ["ready", "clear"] and len(c.event_times) == 2
    frames = [m for m in got if isinstance(m, bytes)]
    assert frames and all(len(f) == 640 for f in frames)
    # the mic's clip was cued by what was heard: it began after the first chunk did
    loud_at = next(i for i, f in enumerate(frames) if np.frombuffer(f, "<i2").any())
    assert mic.start_frames == [loud_at] and mic.onset(0, c) >= c.heard[0].start - 0.02


# ---- the whole bench, real server -----------------------------------------------------------------
@pytest.mark.models
@pytest.mark.skipif(not flite_available(), reason="needs flite")
def test_bench_overlap_runs_against_the_real_server(tmp_path):
    out = tmp_path / "overlap.json"
    assert ov.main(["--items", "1", "--categories", "turn_taking,backchannel", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["category"]: r for r in report["items"]}
    assert set(rows) == {"turn_taking", "backchannel"} and set(report["categories"]) == set(rows)
    tt, bc = rows["turn_taking"], rows["backchannel"]
    assert tt["valid"] and tt["marks_sent"] > 0 and tt["finals"] and isinstance(tt["take_over"], bool)
    assert 0 < tt["latency_s"] < 20
    assert bc["valid"], bc["reason"]
    assert bc["outcome"] in ("went_on", "resumed", "cut", "new_reply", "stopped")
    assert bc["onset"] > bc["story_first_heard"] and bc["delay_s"] >= 1.5
    assert 0 <= bc["longest_silence_s"] <= 15 and isinstance(bc["passed"], bool)
    assert report["categories"]["backchannel"]["items"] == 1
