"""Word error rate with a simple English normaliser (pure functions)."""
from __future__ import annotations

import re

_NUMBERS = {
    "zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
    "mr": "mister", "mrs": "missus", "dr": "doctor",
}


def normalize(text: str) -> list[str]:
    """Lower-case, strip punctuation, spell digits the same way on both sides."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    words = []
    for w in text.split():
        w = w.strip("'")
        if not w:
            continue
        if w.isdigit() and len(w) > 2:
            words.extend(w)  # "29340" -> "2 9 3 4 0", as spoken digit strings are
        else:
            words.append(_NUMBERS.get(w, w))
    return words


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(refs: list[str], hyps: list[str]) -> float:
    """Corpus WER: total edits over total reference words."""
    errors = words = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        r, h = normalize(ref), normalize(hyp)
        errors += edit_distance(r, h)
        words += len(r)
    return errors / max(words, 1)


def cer(refs: list[str], hyps: list[str]) -> float:
    """Corpus character error rate over the normalised words' letters, spaces left out: where a
    recogniser puts word boundaries ("France is" heard as "Francis") does not count."""
    errors = chars = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        r, h = (list("".join(normalize(t)).replace("'", "")) for t in (ref, hyp))
        errors += edit_distance(r, h)
        chars += len(r)
    return errors / max(chars, 1)
