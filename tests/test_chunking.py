import argparse

import pytest

from agent.serving.cli import positive_int
from tts.chunking import TextChunker


def feed(text, **kw):
    c = TextChunker(**kw)
    out = []
    for tok in text.replace(" ", " \x00").split("\x00"):
        out += c.push(tok)
    return out, c.flush()


def test_sentences_and_first_clause():
    text = "The capital of France is Paris, a city on the Seine. It is lovely! Mr. Smith agrees."
    chunks, rest = feed(text, first_clause_words=4, first_max_words=7)
    assert chunks == ["The capital of France is Paris,", "a city on the Seine.", "It is lovely!"]
    assert rest == ["Mr. Smith agrees."]
    # the defaults start speaking after two words, at a clause of two if one comes first
    chunks, rest = feed(text)
    assert chunks == ["The capital", "of France is Paris, a city on the Seine.", "It is lovely!"]
    chunks, _ = feed("Yes, it is. Rain, of course, falls.")
    assert chunks[0] == "Yes, it is."  # the sentence ended with the token after the second word
    chunks, _ = feed("Well, rain falls, mostly in spring and autumn.")
    assert chunks[0] == "Well, rain falls,"  # a clause mark that arrives with the cut wins
    chunks, _ = feed("Yes. Rain falls.")
    assert chunks[0] == "Yes."  # a sentence end cuts at any length
    # a first chunk of three to four words
    chunks, _ = feed(text, first_clause_words=3, first_max_words=4)
    assert chunks[0] == "The capital of France"


def test_no_cut_inside_numbers_or_abbreviations():
    chunks, rest = feed("It costs 2.5 dollars, says Dr. Who, today.")
    assert all("2." != c[-2:] for c in chunks)
    assert " ".join(chunks + rest) == "It costs 2.5 dollars, says Dr. Who, today."


def test_long_text_without_punctuation_is_cut():
    words = " ".join(f"w{i}" for i in range(70))
    chunks, rest = feed(words)
    assert chunks and all(len(c.split()) <= 31 for c in chunks)
    assert " ".join(chunks + rest).split() == words.split()


def test_a_long_first_sentence_is_cut_early_and_later_ones_are_not():
    text = ("A brave little dragon was living in a terrifying and dangerous cave near the old village "
            "and it was very happy there with all of its many friends and family members for years.")
    chunks, rest = feed(text)
    assert len(chunks[0].split()) == 2  # spoken before the sentence is complete
    # the second piece is cut too, so that it is ready before the short first one has been said
    assert len(chunks[1].split()) == 16
    assert all(len(c.split()) > 7 for c in chunks[1:] + rest)
    assert " ".join(chunks + rest) == text


def test_the_first_clause_may_end_from_two_words_or_the_first_chunks_size():
    assert TextChunker().first_clause_words == 2
    assert TextChunker(first_max_words=4).first_clause_words == 2
    assert TextChunker(first_max_words=1).first_clause_words == 1
    assert TextChunker(first_clause_words=3, first_max_words=4).first_clause_words == 3


def test_a_two_word_first_chunk():
    # `SessionConfig.first_chunk_words=2` (`--first-chunk-words 2`): speech starts two tokens sooner
    chunks, rest = feed("The capital of France is Paris.", first_clause_words=2, first_max_words=2)
    assert chunks == ["The capital"] and rest == ["of France is Paris."]
    chunks, _ = feed("Well, honestly, it is Paris.", first_clause_words=2, first_max_words=2)
    assert chunks[0] == "Well, honestly,"  # a clause mark at two words cuts there


def test_the_first_chunk_size_flag_takes_positive_integers():
    assert positive_int("2") == 2
    for bad in ("0", "-3", "two"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            positive_int(bad)
