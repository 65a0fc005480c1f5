import textutils


def test_normalize_space():
    assert textutils.normalize_space("  a   b ") == "a b"


def test_word_count():
    assert textutils.word_count("") == 0
    assert textutils.word_count("  hello   world ") == 2
    assert textutils.word_count("one\ntwo\tthree") == 3
