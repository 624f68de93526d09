"""Where one turn's voice-to-voice time went: the per-turn stage breakdown.

One function, :func:`breakdown`, for every reader of a turn's milestones: the session's own
records (``TurnRecord.summary()``, perf_counter seconds), ``duplex trace report`` (trace events,
ns) and ``duplex bench latency`` (records measured from the input file's exact end of speech).

The milestones, in causal order, and the stage that ends at each one:

==================== ================================ =====================================
milestone            stage key                        measures
==================== ================================ =====================================
``speech_end``       (start)                          the user stops speaking
``endpoint``         ``endpoint_ms``                  end-of-turn decision
``asr_final``        ``asr_final_ms``                 final transcript
``llm_first_token``  ``llm_ttft_ms``                  LLM time to first token
``tts_first_chunk``  ``tts_first_chunk_ms``           the voice's first audio
``first_audio_out``  ``send_ms``                      first audio handed to the transport
==================== ================================ =====================================

plus ``voice_to_voice_ms`` = ``speech_end`` → ``first_audio_out``.

A stage runs from the last milestone reached before it, so a missing milestone leaves its own
stage empty (None) and the next stage covers the gap. A speculative reply reaches later
milestones before earlier ones (its LLM starts before the endpoint): each milestone is clamped
to the one reached before it, so that stage reads 0 and the stages always add up to
voice-to-voice, never a negative wait.
"""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MILESTONES", "STAGE_KEYS", "clamped", "breakdown"]

#: Milestone names, in causal order (the attributes of ``agent.conversation.records.TurnRecord``).
MILESTONES: tuple[str, ...] = (
    "speech_end", "endpoint", "asr_final", "llm_first_token", "tts_first_chunk", "first_audio_out",
)
#: Stage keys of :func:`breakdown`; stage i ends at milestone i + 1.
STAGE_KEYS: tuple[str, ...] = (
    "endpoint_ms", "asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms", "send_ms",
)

Time = float | int | None
_NOT_GIVEN = object()  # playout_start left out: the caller does not track the far end's playout


def clamped(marks: Sequence[Time]) -> list[Time]:
    """Milestone times with each reached one moved up to the last reached one before it.

    ``None`` or ``0`` means not reached (``TurnRecord``'s default) and comes back as ``None``.
    """
    out: list[Time] = []
    prev: Time = None
    for m in marks:
        if not m:
            out.append(None)
            continue
        prev = m if prev is None else max(m, prev)
        out.append(prev)
    return out


def breakdown(speech_end: Time, endpoint: Time, asr_final: Time, llm_first_token: Time,
              tts_first_chunk: Time, first_audio_out: Time, *, playout_start: Time = _NOT_GIVEN,
              unit_ms: float = 1000.0) -> dict[str, float | None]:
    """The stage breakdown of one turn, in ms rounded to 0.1 (None: a milestone not reached).

    Times are on one clock in any unit: ``unit_ms`` is milliseconds per unit (1000 for
    perf_counter seconds, 1e-6 for trace ns); ``None`` or ``0`` means not reached.

    Returns :data:`STAGE_KEYS` and ``voice_to_voice_ms`` (None without ``speech_end`` or
    ``first_audio_out``, e.g. a greeting). With ``playout_start`` (the far end starting to play,
    when a trace has it) also ``client_playout_ms``, the stage ending there.
    """
    marks = [speech_end, endpoint, asr_final, llm_first_token, tts_first_chunk, first_audio_out]
    keys = list(STAGE_KEYS)
    if playout_start is not _NOT_GIVEN:
        marks.append(playout_start)
        keys.append("client_playout_ms")
    marks = clamped(marks)

    def ms(a: Time, b: Time) -> float | None:
        return None if a is None or b is None else round((a - b) * unit_ms, 1)

    out: dict[str, float | None] = {}
    prev = marks[0]
    for key, m in zip(keys, marks[1:]):
        out[key] = ms(m, prev)
        if m is not None:
            prev = m
    out["voice_to_voice_ms"] = ms(marks[5], marks[0])
    return out
