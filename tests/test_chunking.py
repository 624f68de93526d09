from tts.chunking import TextChunker


def feed(text, **kw):
    c = TextChunker(**kw)
    out = []
    for tok in text.replace(" ", " \x00").split("\x00"):
        out += c.push(tok)
    return out, c.flush()


def test_sentences_and_first_clause():
    chunks, rest = feed("The capital of France is Paris, a city on the Seine. It is lovely! Mr. Smith agrees.")
    assert chunks == ["The capital of France is Paris,", "a city on the Seine.", "It is lovely!"]
    assert rest == ["Mr. Smith agrees."]


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
    assert len(chunks[0].split()) == 7  # spoken before the sentence is complete
    assert all(len(c.split()) > 7 for c in chunks[1:] + rest)
    assert " ".join(chunks + rest) == text
