"""Whether speech over the bot is said by a user turned away from the microphone, to someone
else in the room, rather than to the bot: quieter than their own turns, and reverberant.

Words alone cannot tell "Can you close the window?" said to the bot from the same words said to
someone across the room; the sound can. Said into the microphone, the end of a syllable falls
20-40 dB within 32 ms; said away from it, the room's reverberation (the direct sound and a
tail about as loud as each other, RT60 0.3-0.5 s) draws the same fall out over 100 ms and more,
and the level drops 3-10 dB. `SharpestFall` measures an utterance's largest fall within 32 ms
and within 128 ms; a fall is judged only once a syllable has ended (the 128 ms fall at least
half the user's sharpest): voiced speech can run for half a second with no fall at all, and no
fall that early is no sign of a room; none in 0.6 s of speech is (`TurnedAway.unbroken_s`).
Every figure is judged against the user's own turns, so that the microphone, the voice, its
usual level and the room's usual reverberation cancel out; with no turn of the user's heard yet
nothing is judged. Levels are floored at `FLOOR_DB`.

On `duplex bench overlap`'s audio (flite's and Piper's voices, the side talk 3-6 dB below the
user with a synthetic room, RT60 0.3-0.5 s), fed as the listener feeds it (Silero's frames, the
levels of the audio ring), once a syllable had ended: side talk fell 0.19-0.36 of the user's
sharpest fall within 32 ms (one item 0.49, one with no syllable's end in its first second),
interruptions 0.46-1.0 (Piper's voice the lowest; 0.54 and more where they were quieter than the
user's turns), hence a ratio of 0.45; interruptions 2.5-5 dB
below the user's loudest frame are common that early (their loudest syllable has not come yet),
hence both signals together. Words that ask the bot to stop or wait still stop it (turns.py).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from itertools import islice
from dataclasses import dataclass

STEP_S = 0.016  # the steps whose levels are compared
FALL_STEPS = 2  # a fall is measured over this many steps (32 ms)
END_STEPS = 8  # ... and a syllable's end over this many (128 ms), however the room draws it out
# levels are floored here (dBFS), below any microphone's noise: a fall into digital silence (a
# file's, a noise gate's) would otherwise be a fall of 150 dB, and make every other look gentle
FLOOR_DB = -70.0


def level_db(rms: float) -> float:
    return 20.0 * math.log10(max(rms, 1e-9))


class SharpestFall:
    """The largest fall in level (dB) within `FALL_STEPS` `STEP_S` steps (`db`) and within
    `END_STEPS` (`end_db`: a syllable ended, quickly or not), over the steps fed since the last
    `restart` (the steps just before it still count as the start of a fall)."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=END_STEPS)
        self.db = self.end_db = 0.0

    def restart(self) -> None:
        self.db = self.end_db = 0.0

    def feed(self, rms: float) -> None:
        level = max(level_db(rms), FLOOR_DB)
        if self._recent:
            self.db = max(self.db, max(islice(reversed(self._recent), FALL_STEPS)) - level)
            self.end_db = max(self.end_db, max(self._recent) - level)
        self._recent.append(level)


@dataclass(frozen=True)
class TurnedAway:
    """When speech over the bot is judged said away from the microphone: once it has lasted
    `after_s`, its loudest frame is `level_db` or more below the user's turns' and its sharpest fall
    at most `fall_ratio` of theirs (medians over their last turns). Speech that begins within
    `carry_s` of the end of speech judged so, as quiet, is judged so too whatever its falls: the
    user has not turned back ("Hey," then "could you ...": a stop consonant at the onset of the
    second falls sharply even in a room)."""

    after_s: float = 0.4
    level_db: float = -2.5
    fall_ratio: float = 0.45
    carry_s: float = 2.0
    # a fall is judged only once a syllable has ended (a fall over `END_STEPS` this share of the
    # user's sharpest): "Can you close ..." runs on voiced for half a second with no fall at all
    end_ratio: float = 0.5
    # ... and speech that has gone on this long (seconds of it) with no syllable's end at all is
    # reverberant too: the room draws every end out. Said into the microphone, speech has ended
    # one by then: every interruption of the bench's voices by 0.6 s (0.85 of the user's
    # sharpest fall and more), and each of the dev recordings (0.61 and more; one was at 0.49
    # at 0.5 s); kal's "Could you hand me that pen" said away reached 0.22-0.38 in its first second,
    # and waited a second and more for a syllable's end (None: only a syllable's end decides)
    unbroken_s: float | None = 0.6

    def judge(self, peak: float, fall: SharpestFall, user_peak: float, user_fall_db: float,
              still_away: bool = False, spoken_s: float = 0.0) -> bool:
        """`peak`, `user_peak`: RMS of the loudest frames; `fall`: the speech's falls,
        `user_fall_db`: the user's sharpest; `still_away`: speech judged away ended less than
        `carry_s` before this began; `spoken_s`: how long the speech has gone on."""
        if user_fall_db <= 0.0:
            return False
        if self.syllable_ended(fall, user_fall_db):
            reverberant = fall.db <= self.fall_ratio * user_fall_db
        else:
            reverberant = self.unbroken_s is not None and spoken_s >= self.unbroken_s - 1e-9
        return self.quieter(peak, user_peak) and (still_away or reverberant)

    def quieter(self, peak: float, user_peak: float) -> bool:
        """Speech whose loudest frame is `level_db` or more below the user's turns' (RMS both)."""
        return peak > 0.0 and user_peak > 0.0 and level_db(peak) - level_db(user_peak) <= self.level_db

    def syllable_ended(self, fall: SharpestFall, user_fall_db: float) -> bool:
        """A syllable of the speech has ended: its falls can be judged."""
        return fall.end_db >= self.end_ratio * user_fall_db


class SoundOfOverlaps:
    """One line's judgement of speech over the bot by its sound: the sharpest falls of the current
    utterance and of the user's own turns, and whether the current one is said away (`away`, once
    judged so it stays so until the utterance ends)."""

    def __init__(self) -> None:
        self.fall = SharpestFall()  # of the current utterance
        self._user_falls: deque[float] = deque(maxlen=8)  # ... of the user's last turns
        self.away = False
        self._away_ended: float | None = None  # the end of the last speech judged away
        # the first judgement of the current utterance: (its loudest frame against the user's, dB;
        # its sharpest fall as a share of theirs; away), for the trace
        self.judged: tuple[float, float, bool] | None = None

    def feed(self, steps: tuple[float, ...]) -> None:
        for rms in steps:
            self.fall.feed(rms)

    def begin(self) -> None:
        """A new utterance (its falls count from its first speech frame: `fall.restart` then)."""
        self.away, self.judged = False, None

    def user_turn(self, fall_db: float) -> None:
        """The sharpest fall of a turn of the user's own (the reference)."""
        if fall_db > 0.0:
            self._user_falls.append(fall_db)

    def judge(self, c: TurnedAway, peak: float, user_peak: float, start: float, spoken_s: float) -> bool:
        """Judge the utterance begun at stream time `start` so far (`spoken_s` of it); `peak`,
        `user_peak`: its loudest frame and the user's turns' (RMS)."""
        if self.away or user_peak <= 0.0 or not self._user_falls:
            return self.away
        user_fall = statistics.median(self._user_falls)
        still = self._away_ended is not None and start - self._away_ended <= c.carry_s
        self.away = c.judge(peak, self.fall, user_peak, user_fall, still, spoken_s)
        if (self.judged is None and c.syllable_ended(self.fall, user_fall)) or self.away:
            self.judged = (round(level_db(peak) - level_db(user_peak), 1), round(self.fall.db / user_fall, 2), self.away)
        return self.away

    def end(self, t_speech_end: float) -> None:
        """The utterance ended at `t_speech_end`."""
        if self.away:
            self._away_ended = t_speech_end
        self.away = False
