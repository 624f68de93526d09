"""Cut a streaming LLM answer into speakable chunks at sentence or clause boundaries (pure)."""
from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"([.!?]+[\"')\]]*)(\s+|$)")
_CLAUSE_MARKS = ",;:\u2014"
_CLAUSE_END = re.compile(rf"([{_CLAUSE_MARKS}]|\s-\s)(\s+)")
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "vs.", "e.g.", "i.e.", "etc.", "no."}


def has_words(text: str) -> bool:
    """The text holds a letter or digit: not empty, blank or punctuation alone."""
    return any(ch.isalnum() for ch in text)


def ends_sentence(text: str) -> bool:
    """The text ends with sentence punctuation (closing quotes and brackets allowed)."""
    return text.rstrip().rstrip("\"')]").endswith((".", "!", "?"))


def ends_clause(text: str) -> bool:
    """The text ends with a clause mark (the marks the chunker cuts at)."""
    return text.rstrip().endswith((*_CLAUSE_MARKS, "-"))


class TextChunker:
    """Feed tokens with `push`; receive chunks as soon as a boundary is certain.

    The first chunk of an answer may end at a clause boundary once it has `first_clause_words`
    words, or at any word boundary past `first_max_words` words, so speech starts early: each
    word waited for costs one LLM token before the first audio (`duplex bench latency` shows
    the first chunk's stage). Two words by default: the voice says them in ~0.6 s, long enough to
    synthesize the next chunk, which is cut at a clause past `clause_words` or anywhere past
    `second_max_words` words (a word of LLM and voice time costs tens of ms, so it is ready
    before the first runs out). Later chunks break at clauses past `clause_words` words, and
    anywhere past `max_words`. The cut costs no measurable intelligibility
    (`scripts/chunk_join_wer.py` re-measures the round-trip WER by first-chunk size).
    """

    def __init__(self, first_clause_words: int | None = None, first_max_words: int = 2, clause_words: int = 12,
                 max_words: int = 30, second_max_words: int = 16):
        # a clause mark may end the first chunk from two words on (or sooner, when the first
        # chunk is shorter than that)
        self.first_clause_words = min(2, first_max_words) if first_clause_words is None else first_clause_words
        self.first_max_words = first_max_words
        self.second_max_words = second_max_words
        self.clause_words = clause_words
        self.max_words = max_words
        self._buf = ""
        self._emitted = 0

    def push(self, token: str) -> list[str]:
        self._buf += token
        out = []
        while (chunk := self._cut()) is not None:
            out.append(chunk)
        return out

    def flush(self) -> list[str]:
        rest, self._buf = self._buf.strip(), ""
        return [rest] if rest else []

    def _cut(self) -> str | None:
        buf = self._buf
        for m in _SENTENCE_END.finditer(buf):
            if not m.group(2):  # boundary at the very end: the next token may continue it
                break
            head = buf[:m.end(1)]
            last = head.split()[-1].lower() if head.split() else ""
            if last in _ABBREVIATIONS or re.search(r"\d\.$", head) and not m.group(2):
                continue
            return self._take(m.end())
        words = len(buf.split())
        limit = self.first_clause_words if self._emitted == 0 else self.clause_words
        if words >= limit:
            for m in _CLAUSE_END.finditer(buf):
                if len(buf[:m.end(1)].split()) >= limit:
                    return self._take(m.end())
        hard = (self.first_max_words if self._emitted == 0 else
                self.second_max_words if self._emitted == 1 else self.max_words)
        if words > hard:
            # no boundary yet: cut at the last space (the word after it may still be growing)
            cut = buf.rstrip().rfind(" ")
            if cut > 0:
                return self._take(cut + 1)
        return None

    def _take(self, end: int) -> str:
        chunk, self._buf = self._buf[:end].strip(), self._buf[end:]
        self._emitted += 1
        return chunk
