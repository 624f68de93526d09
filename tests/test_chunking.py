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
